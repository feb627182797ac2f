"""verify's defaults, apart from the engine: the command line's help shows them without importing torch (so
`flashcheck verify --help` and a usage error answer at once, before any worker or backend exists)."""

DEFAULT_TARGET = "flashcheck.kernel.fused:attention"
DEFAULT_EXAMPLES = 25   # generated cases judged after the whole catalogue (derandomized: the same every run)
MAX_AUTO_JOBS = 16      # worker processes at most by default (each holds a CUDA context on the GPU)
