"""The bug corpus: every known FlashAttention-2 bug as a named mutant that the suite must kill.

A mutant is a text transformation of one of the project's kernel modules (kernel/fused.py or
kernel/unfused.py): find this text, put that text. The real kernel files never carry bug switches;
``load`` writes the transformed source to a temporary .py file (Triton's jit reads the source of the
functions it compiles) and imports it under a name of its own, so the mutant's ``attention`` can be judged
by the oracle exactly like the real one.

Each mutant records what it breaks, where the bug comes from ("seed: <section>" is the technical note
restated in docs/design.md, "The seed's requirements"), the catalogue cases expected to kill it and, for
the few that only the compiled GPU path can show, why the interpreter cannot. A find-text that no longer occurs exactly once in the current
kernel source raises MutantDrift naming the mutant: a refactor of the kernel must carry the corpus along.

Judging: in-process on the CPU by default (the interpreter cannot fault a device, and every corpus mutant
keeps its stray accesses inside the oracle's guard bands on the CPU-judgeable catalogue); on the GPU every
mutant is judged in the worker processes of cases/runner/worker.py (the runner verify uses too), so that an
illegal memory access is reported as a "device fault" kill of that mutant and never poisons the CUDA context
of anything else. isolate=True (``--isolate``) uses the workers on the CPU too: the sweep always does, since
a generated mutant can write far outside the guard bands and corrupt the interpreter's own memory.
"""
import atexit
import difflib
import queue
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from flashcheck.cases import catalogue
from flashcheck.cases.backend import backend
from flashcheck.cases.declarations import Declarations
from flashcheck.cases.oracle import Failure, Kind, Verdict
from flashcheck.cases.runner.target import MUTANT_PREFIX, Loaded, TargetError, import_file_as
from flashcheck.cases.runner.worker import Died, Hung, Raised, Worker
from flashcheck.cases.verify.judging import Settings, judge_case

KERNEL_DIR = Path(__file__).resolve().parents[2] / "kernel"   # flashcheck.kernel, in a checkout or a wheel
MODULES = {"fused": KERNEL_DIR / "fused.py", "unfused": KERNEL_DIR / "unfused.py"}


class MutantDrift(Exception):
    """A mutant's find-text does not occur exactly once in the current kernel source."""


@dataclass(frozen=True)
class Mutant:
    name: str            # snake_case, unique
    module: str          # "fused" or "unfused": the kernel/<module>.py file it transforms
    find: str            # exact text that must occur exactly once in the current kernel source
    replace: str
    breaks: str          # what it breaks, one sentence
    origin: str          # seed section or other source
    killers: tuple       # names of catalogue cases expected to kill it
    gpu_only: str = ""   # non-empty: why only the compiled GPU path shows it (skipped on CPU with this reason)
    edits: tuple = ()    # further (find, replace) pairs, applied in order after the first
    entry: str = "attention"   # the module's function judged (attention_tf32x3 for a bug of that mode)
    strays: str = ""     # non-empty: why its stray accesses leave the guard bands (memory the kernel's wrapper
                         # allocates itself): judged in worker processes on every backend, where a crash is a kill

    @property
    def all_edits(self):
        return ((self.find, self.replace),) + tuple(tuple(e) for e in self.edits)


def _kernel_text(module):
    try:
        return MODULES[module].read_text()
    except KeyError:
        raise ValueError(f"unknown kernel module {module!r}; expected one of {sorted(MODULES)}") from None


def source(mutant):
    """The mutant's module source: the current kernel text with each edit applied in order. Raises
    MutantDrift when a find-text does not occur exactly once (at the point its edit is applied)."""
    text = _kernel_text(mutant.module)
    edits = mutant.all_edits
    for i, (find, replace) in enumerate(edits):
        count = text.count(find)
        if count != 1:
            which = f"edit {i + 1} of {len(edits)}" if len(edits) > 1 else "its find-text"
            raise MutantDrift(
                f"mutant {mutant.name}: {which} occurs {count} times in kernel/{mutant.module}.py (must be "
                f"exactly once; the kernel changed under the mutant, update cases/corpus/mutants.py):\n"
                + _indent(find))
        text = text.replace(find, replace)
    return text


def diff(mutant):
    """A unified diff of the kernel module against the mutant."""
    before = _kernel_text(mutant.module).splitlines(keepends=True)
    after = source(mutant).splitlines(keepends=True)
    return "".join(difflib.unified_diff(before, after, f"kernel/{mutant.module}.py",
                                        f"mutant {mutant.name}", n=1))


def _indent(text):
    return "\n".join("    | " + line for line in text.splitlines())


_TMP = []
_LOADED = {}


def _tmpdir():
    if not _TMP:
        path = tempfile.mkdtemp(prefix="flashcheck_mutants_")
        atexit.register(shutil.rmtree, path, True)
        _TMP.append(Path(path))
    return _TMP[0]


def load(mutant):
    """Import the mutant's module (cached per process) and return it; ``.attention`` is the mutant kernel.

    The source goes to a real file because Triton's jit reads its functions' source through inspect."""
    text = source(mutant)
    key = (mutant.name, text)
    if key in _LOADED:
        return _LOADED[key]
    name = f"flashcheck_mutant_{mutant.name}"
    if name in sys.modules:   # same name, other text (a regenerated sweep mutant): keep both apart
        name += f"_{len(_LOADED)}"
    path = _tmpdir() / f"{name}.py"
    path.write_text(text)
    module = import_file_as(path, name)
    _LOADED[key] = module
    return module


def kernel(mutant):
    """The mutant's attention function: its module's entry point (``attention`` unless it says otherwise)."""
    return getattr(load(mutant), mutant.entry)


def target(mutant):
    return f"mutant {mutant.name} (kernel/{mutant.module}.py)"


def spec(mutant):
    """What the runner loads for a mutant (cases/runner/target.py Loaded): its name for one of the corpus, the
    Mutant itself for a generated one (the sweep's)."""
    if BY_NAME.get(mutant.name) == mutant:
        return f"{MUTANT_PREFIX}{mutant.name}"
    return Loaded("flashcheck.cases.corpus.mutants:kernel", mutant, f"mutant {mutant.name}")


def kernel_named(name):
    """The attention function of the corpus's mutant `name` (the runner's loader for spec(); TargetError for a name
    the corpus does not have)."""
    try:
        return kernel(get(name))
    except KeyError as exc:
        raise TargetError(str(exc.args[0])) from None


def _cases(mutant, cases):
    return [catalogue.get(c) if isinstance(c, str) else c for c in (mutant.killers if cases is None else cases)]


def kill(mutant, cases=None, *, isolate=None, timeout=None):
    """Judge the mutant's attention with flashcheck.cases.oracle.judge on its killers (or on the given cases:
    Case objects or catalogue names). Returns [(case, Verdict)]; the mutant is killed iff some verdict failed.

    isolate (default: on the GPU backend) runs the judging in the worker processes of cases/runner/worker.py:
    a device fault or a crash there is a kill of this mutant and leaves this process intact."""
    cases = _cases(mutant, cases)
    if isolate is None:
        isolate = backend() == "gpu"
    if isolate or mutant.strays:     # strays would corrupt this process: never judged in it
        return judge_isolated([(mutant, cases)], timeout=timeout)[0]
    attention = kernel(mutant)
    return [(c, judge_in_worker(attention, c, target(mutant))) for c in cases]


def killed(results):
    """Whether kill()'s results kill the mutant: some verdict failed."""
    return any(v.failed for _, v in results)


def judge_in_worker(attention, case, name):
    """The verdict of one case on a mutant, judged exactly as verify judges a kernel (the oracle's layers,
    then the properties); a mutant is one of our kernels and carries their declarations."""
    return judge_case(attention, case, Settings(target=name, decl=Declarations.of(attention)))


DEFAULT_TIMEOUT = 600.0      # seconds a case may take before the worker is declared hung


def _judge_task(worker, mutant, cases, stop_at_first, timeout, on_verdict):
    worker.open(spec(mutant), reuse=not mutant.strays)
    results = []
    for case in cases:
        try:
            verdict = worker.call("flashcheck.cases.corpus.mutants:judge_in_worker", case, target(mutant),
                                  timeout=timeout)
        except Hung as exc:
            verdict = Verdict(case, target(mutant), [Failure(Kind.TIMEOUT, str(exc))])
        except Died as exc:
            verdict = Verdict(case, target(mutant), [Failure(exc.kind, str(exc))])
        except Raised as exc:
            raise RuntimeError(f"the oracle raised on {case.name} for mutant {mutant.name}: {exc}") from None
        results.append((case, verdict))
        if on_verdict is not None:
            on_verdict(mutant, case, verdict)
        if stop_at_first and verdict.failed:
            break
    return results


# Servers of judge_isolated's workers kept between calls in this process (the test suite calls it once per mutant),
# with their child: not every mutant pays for a new interpreter importing torch and Triton (on an H200 host under the
# suite's load, seconds of each of the corpus's 100-odd tests), nor for a new CUDA context (Worker.open's reuse). A
# mutant is one of the project's kernels with one edit: it imports as a module of its own name and changes no state
# of the process, so the next mutant finds none of it (on the CPU every mutant is judged in the suite's own
# process). A child that died, hung or holds a sticky CUDA error is gone, and the next mutant gets a fresh one. A
# mutant with strays never uses one (judge_isolated).
_SPARE, _SPARE_LOCK = [], threading.Lock()


def _spare_worker(timeout):
    with _SPARE_LOCK:
        worker = _SPARE.pop() if _SPARE else None
    if worker is None:
        return Worker(timeout, compile_timeout=timeout)
    worker.timeout = worker.compile_timeout = timeout
    return worker


def _park(worker):
    """Keep the worker for the next call, its child too where one is open (the next mutant reuses it)."""
    if worker.park(keep_child=True):
        with _SPARE_LOCK:
            _SPARE.append(worker)
    else:
        worker.close()


@atexit.register
def _close_spares():
    with _SPARE_LOCK:
        spares, _SPARE[:] = list(_SPARE), []
    for worker in spares:
        worker.close()


def judge_isolated(tasks, jobs=1, stop_at_first=False, timeout=None, on_done=None, on_verdict=None):
    """Judge [(mutant, cases)] in `jobs` workers (cases/runner/worker.py): a mutant in the child the mutant before
    it left clean, or in a fresh one (after a death, a hang or a sticky CUDA error; always for a mutant with strays).
    Returns the [(case, Verdict)] lists in the order of the tasks; on_done(index, mutant, results) is called
    as each task finishes. A mutant that no longer applies or does not import raises RuntimeError."""
    pending = queue.Queue()
    for i, task in enumerate(tasks):
        pending.put((i, task))
    out = [None] * len(tasks)
    errors = []

    def slot():
        # the corpus's kernels are the project's own: their first call compiles within the same generous limit
        worker = _spare_worker(timeout or DEFAULT_TIMEOUT)
        try:
            while not errors:
                try:
                    i, (mutant, cases) = pending.get_nowait()
                except queue.Empty:
                    return
                # a mutant whose stores stray past its tensors corrupts whatever lies there: what it hits (a crash,
                # or nothing the oracle sees) depends on its process's heap, so it always runs in a new server, whose
                # children fork from the same state every time (a served one's heap depends on the mutants before)
                own = Worker(worker.timeout, compile_timeout=worker.timeout, fresh=True) if mutant.strays else None
                try:
                    out[i] = _judge_task(own or worker, mutant, cases, stop_at_first, timeout, on_verdict)
                except TargetError as exc:
                    raise RuntimeError(str(exc)) from None
                finally:
                    if own is not None:
                        own.close()
                if on_done is not None:
                    on_done(i, mutant, out[i])
        except BaseException as exc:  # noqa: BLE001  (re-raised in the caller's thread)
            errors.append(exc)
        finally:
            _park(worker)

    threads = [threading.Thread(target=slot, daemon=True) for _ in range(max(1, min(jobs, len(tasks))))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


# ---------------------------------------------------------------------------------------------------------
# The corpus. Killers are the catalogue cases that kill the mutant on every backend that can judge it.

_SEED_MASKS = "seed: Masks and sentinels"
_SEED_CROSS = "seed: Masks and sentinels (cross-attention: Nq and Nk keep their roles)"
_SEED_RESCALE = "seed: The rescale direction"
_SEED_STATE = "seed: The online-softmax state (per-iteration order)"
_SEED_DOT = "seed: tl.dot constraints that bit"
_SEED_DECOMP = "seed: Decomposition"
_SEED_UNFUSED = "seed: The unfused three-kernel baseline (bugs found while building it)"
_SEED_CAUSAL = "seed: First iteration (a fully masked row needs a guard) + docs/design.md protocol"
_CAUSAL_ALIGN = "docs/design.md: attention protocol (causal is aligned bottom-right, as in FlashAttention)"
_STRIDES = "seed: Not covered here (multiple heads and batches: extra index*stride terms)"
_OTHER = "other: realistic slip in this kernel's structure"
_TMA = "issue 13: tensor-descriptor loads"
_D_SPLIT = "issue 13: fp32 D = 128 in two halves of the head dim"
# The loop function sees only Nk; the mutants that give one of Nk's roles to Nq first pass Nq in too.
_PASS_NQ = (("start_m, lo, hi, Nk, causal_shift,", "start_m, lo, hi, Nk, Nq, causal_shift,"),
            ("start_m, lead_lo, lead_hi, Nk,", "start_m, lead_lo, lead_hi, Nk, Nq,"),
            ("start_m, fast_lo, fast_hi, Nk,", "start_m, fast_lo, fast_hi, Nk, Nq,"),
            ("start_m, masked_lo, masked_hi, Nk,", "start_m, masked_lo, masked_hi, Nk, Nq,"),
            ("start_m, keys_lo, keys_hi, Nk,", "start_m, keys_lo, keys_hi, Nk, Nq,"),
            ("masked_lo, masked_hi, Nk,\n" + " " * 19 + "causal_shift,",
             "masked_lo, masked_hi, Nk, Nq,\n" + " " * 19 + "causal_shift,"),
            ("masked_lo, masked_hi, Nk,\n" + " " * 46 + "causal_shift,",
             "masked_lo, masked_hi, Nk, Nq,\n" + " " * 46 + "causal_shift,"))

MUTANTS = [
    # --- masks and sentinels -------------------------------------------------------------------------
    Mutant("kv_other_neg_inf", "fused",
           "x = tl.load(ptrs, mask=kv_mask, other=0.0)", 'x = tl.load(ptrs, mask=kv_mask, other=float("-inf"))',
           "K/V load masked lanes as -inf: padded head-dim columns make every score NaN through 0 * inf in "
           "the dot, and padded key rows of V make P.V NaN through 0 * -inf",
           _SEED_MASKS, ("partial_last_key_block", "head_dim_17", "nk_lt_block_n"),
           edits=(("x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)",
                   'x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=float("-inf"))'),)),
    Mutant("kv_mask_plus", "fused",
           "kv_mask = kv_rows & (offs_d[None, :] < HEAD_DIM)", "kv_mask = kv_rows + (offs_d[None, :] < HEAD_DIM)",
           "K/V load mask combined with + instead of &: a sum of booleans admits key rows past Nk, so V is "
           "read out of bounds (Triton's 1-bit add even drops lanes where both hold)",
           _SEED_UNFUSED + " (+ instead of &)", ("partial_last_key_block", "nk_lt_block_n")),
    Mutant("score_mask_wrong_axis", "fused",
           "valid = (start_n + offs_n)[None, :] < Nk",
           "valid = (start_n + offs_n)[:, None] < Nk",
           "the score mask varies along the query axis ([:, None]): with BLOCK_M != BLOCK_N it does not "
           "broadcast against S; with square tiles it masks query rows instead of the keys past Nk",
           _SEED_MASKS + " (the score mask must vary along the key axis)",
           ("block_m_gt_block_n", "block_m_lt_block_n", "partial_last_key_block")),
    Mutant("score_mask_from_kv_mask", "fused",
           'qk = tl.where(valid, qk, float("-inf"))',
           'qk = tl.where(kv_rows, qk, float("-inf"))',
           "the K/V load mask (key rows x head-dim columns) used as the score mask: it only broadcasts when "
           "BLOCK_M == BLOCK_N == the head-dim block, and then masks query rows, not keys",
           _SEED_MASKS + " (using the K/V load mask on the scores)",
           ("partial_last_key_block", "cross_nq_gt_nk", "block_m_gt_block_n")),
    Mutant("no_score_mask", "fused",
           '                qk = tl.where(valid, qk, float("-inf"))\n', "",
           "no -inf on the scores of invalid keys: zero-padded keys score 0 and take softmax weight (and the "
           "causal mask is never applied)",
           _SEED_MASKS, ("partial_last_key_block", "nk_lt_block_n", "causal_square")),
    Mutant("kv_mask_off_by_one", "fused",
           "kv_rows = (start_n + offs_n)[:, None] < Nk", "kv_rows = (start_n + offs_n)[:, None] <= Nk",
           "K/V load mask admits key row Nk: one row past the end of K and V is read (V's NaN guard reaches "
           "the output through 0 * NaN)",
           _OTHER + " (index off-by-one)", ("partial_last_key_block", "nk_lt_block_n")),
    Mutant("unmasked_tail_block", "fused",
           "full_hi = Nk // BLOCK_N * BLOCK_N", "full_hi = Nk",
           "the partial last key block runs on the unmasked fast path: K/V rows past Nk are read and score",
           _OTHER + " (masked/unmasked loop split)", ("partial_last_key_block", "nk_lt_block_n")),
    Mutant("inner_lo_not_applied", "fused",
           "    k_ptrs += lo * stride_kn\n    v_ptrs += lo * stride_vn\n", "",
           "the K/V pointers are not advanced to the loop's first block: the masked pass re-reads the first "
           "key blocks while masking as if it read the last ones",
           _OTHER + " (masked/unmasked loop split)", ("partial_last_key_block", "many_key_chunks")),
    # --- cross-attention: Nq and Nk keep their roles -------------------------------------------------
    Mutant("one_length_nq", "fused",
           "H, Nq, Nk, keys_per_split, desc_k, desc_v,", "H, Nq, Nq, keys_per_split, desc_k, desc_v,",
           "one length N = Nq for queries and keys: 1 query vs keys [1, 1] and values [5, 10] gives 5, not "
           "7.5, and Nq > Nk reads keys past the end",
           _SEED_CROSS, ("hand_one_query_two_keys", "cross_nq_lt_nk", "cross_nq_gt_nk")),
    Mutant("loop_bound_nq", "fused",
           "hi = Nk\n        full_hi = Nk // BLOCK_N * BLOCK_N", "hi = Nq\n        full_hi = Nq // BLOCK_N * BLOCK_N",
           "the key loop's count taken from Nq: keys past Nq are ignored (Nq < Nk) or read past the end "
           "(Nq > Nk)",
           _SEED_CROSS + ": loop count", ("cross_nq_lt_nk", "cross_nq_gt_nk")),
    Mutant("kv_mask_nq", "fused",
           "kv_rows = (start_n + offs_n)[:, None] < Nk", "kv_rows = (start_n + offs_n)[:, None] < Nq",
           "the K/V load mask compares key rows with Nq (both lengths passed to the loop, the wrong one "
           "used): rows past Nk are read (Nq > Nk) or valid keys load as 0 (Nq < Nk)",
           _SEED_CROSS + ": K/V load mask", ("cross_nq_gt_nk", "cross_nq_lt_nk"), edits=_PASS_NQ),
    Mutant("score_mask_nq", "fused",
           "valid = (start_n + offs_n)[None, :] < Nk", "valid = (start_n + offs_n)[None, :] < Nq",
           "the score mask compares key columns with Nq (both lengths passed to the loop, the wrong one "
           "used): padded keys score 0 (Nq > Nk) or valid keys are dropped (Nq < Nk)",
           _SEED_CROSS + ": score mask", ("cross_nq_gt_nk", "cross_nq_lt_nk"), edits=_PASS_NQ),
    # --- tl.dot constraints and the head-dim block ---------------------------------------------------
    Mutant("head_dim_block_no_floor", "fused",
           "return max(triton.next_power_of_2(D), 16)", "return triton.next_power_of_2(D)",
           "head-dim block next_power_of_2(D) without the floor of 16: tl.dot's contraction is below the "
           "GPU minimum for D < 16 and the kernel does not compile",
           _SEED_DOT, ("head_dim_1", "head_dim_2", "head_dim_3", "head_dim_2[fp16]"),
           gpu_only="the interpreter runs tl.dot in NumPy for any size; only the GPU compiler enforces "
                    "the minimum of 16"),
    Mutant("head_dim_block_fixed_16", "fused",
           "return max(triton.next_power_of_2(D), 16)", "return 16",
           "head-dim block hard-coded to 16: head dims past 16 are truncated (columns >= 16 never loaded "
           "nor stored)",
           _SEED_DOT + " (do not hard-code 16)", ("head_dim_17", "head_dim_59", "head_dim_64")),
    Mutant("fp32_tf32_dot", "fused",
           '        return "fp64"\n', '        return "tf32"\n',
           "fp32 'ieee' dots run at input_precision='tf32' (where the H200 runs them on the fp64 tensor cores): "
           "operands rounded to tf32 (10 mantissa bits, ~1e-3 relative error) fail the fp32 tolerance",
           _SEED_DOT + " (fp32 operands need an explicit input_precision)", ("fp32_precision",),
           gpu_only="the interpreter computes every dot in full fp32 whatever input_precision says; only "
                    "the GPU's tensor cores round to tf32"),
    Mutant("tf32x3_single_pass", "fused",
           "    return precision\n", '    return "tf32" if precision == "tf32x3" else precision\n',
           "precision='tf32x3' passed to the dot as plain 'tf32': one tensor-core product of operands rounded to "
           "10 mantissa bits instead of three (head x head + head x tail + tail x head), ~1e-3 relative error "
           "where fp32 promises ~1e-7",
           "issue 13 (the tf32x3 precision mode); the same class as fp32_tf32_dot", ("fp32_precision",),
           gpu_only="the interpreter computes every dot in full fp32 whatever input_precision says",
           entry="attention_tf32x3"),
    # --- split-KV (decode): the key splits and their combine ------------------------------------------
    Mutant("split_keys_overlap", "fused",
           "split_hi = split_lo + keys_per_split\n", "split_hi = split_lo + keys_per_split + BLOCK_N\n",
           "each split also folds the first key block of the next: keys at split borders count twice",
           "issue 13 (split-KV decode); split borders of published split-KV kernels", ("split_kv_decode",)),
    Mutant("split_last_keys_dropped", "fused",
           "return triton.cdiv(Nk, keys_per_split), keys_per_split",
           "return Nk // keys_per_split, keys_per_split",
           "the number of splits rounded down: the keys after the last whole split (here key 768) are never read",
           "issue 13 (split-KV decode)", ("split_kv_decode",)),
    Mutant("split_partial_no_l_guard", "fused",
           "l_part = tl.where(l_i == 0.0, 1.0, l_i)", "l_part = l_i",
           "a split holding no key a row sees stores 0/0 = NaN as its partial output; the combine weights it by "
           "exactly 0, and 0 * NaN is NaN",
           "issue 13: a real bug of published split-KV kernels (splits that saw no key)",
           ("split_kv_decode_causal",)),
    Mutant("split_combine_no_inf_guard", "fused",
           'm_shift_c = tl.where(m_new == float("-inf"), 0.0, m_new)', "m_shift_c = m_new",
           "the combine shifts by the running max of the splits' maxima even while it is -inf: -inf - -inf = NaN "
           "for a row whose first combined splits saw no key",
           "issue 13: a real bug of published split-KV combines (lse -inf)", ("split_kv_decode_causal",)),
    # --- the online-softmax state and the rescale direction ------------------------------------------
    Mutant("rescale_paper_inverse", "fused",
           "acc = acc * c[:, None]", "acc = acc / c[:, None]",
           "the accumulator divided by the correction (the FA2 paper's printed diag(c)^-1): 0/0 on the "
           "first block, and l and acc no longer share one scale",
           _SEED_RESCALE + " (the paper's pseudocode as printed)", ("hand_one_query_two_keys", "many_key_chunks")),
    Mutant("l_not_rescaled", "fused",
           "l_i = l_i * c + tl.sum(p, 1)", "l_i = l_i + tl.sum(p, 1)",
           "the denominator l is not rescaled when the running max grows: old terms are over-weighted",
           _SEED_RESCALE, ("many_key_chunks", "many_key_chunks_growing_max")),
    Mutant("acc_not_rescaled", "fused",
           "        acc = acc * c[:, None]\n", "",
           "the accumulator is not rescaled when the running max grows: old blocks are over-weighted",
           _SEED_RESCALE, ("many_key_chunks", "many_key_chunks_growing_max")),
    Mutant("acc_in_input_dtype", "fused",
           "acc = _mma(p.to(v.dtype), v, acc, INPUT_PRECISION)",
           "acc = _mma(p.to(v.dtype), v, acc, INPUT_PRECISION).to(v.dtype).to(acc.dtype)",
           "the accumulator kept in the input dtype between key blocks (fp16/bf16): each block's rounding "
           "adds up, and over hundreds of blocks the output drifts past the tolerance",
           _SEED_STATE + " (acc is fp32)", ("fp16_many_key_blocks", "large_accumulator[fp16]")),
    Mutant("l_in_input_dtype", "fused",
           "l_i = l_i * c + tl.sum(p, 1)", "l_i = (l_i * c + tl.sum(p, 1)).to(v.dtype).to(tl.float32)",
           "the running denominator kept in the input dtype between key blocks (fp16/bf16): the normaliser "
           "drifts, so rows no longer sum to 1",
           _SEED_STATE + " (l is accumulated in fp32 like acc)", ("fp16_many_key_blocks", "large_accumulator[fp16]")),
    Mutant("m_never_updated", "fused",
           "        m_i = m_new  # guards: mutants m_never_updated, masked_max_kept_as_zero; case window_very_negative_scores\n",
           "",
           "the running max is never updated: c = 0 at every block, so only the last key block counts and "
           "the log-sum-exp is -inf",
           _SEED_STATE + " (m = m_new)", ("many_key_chunks", "custom_scale")),
    Mutant("m_new_drops_old_max", "fused",
           "m_new = tl.maximum(m_i, tl.max(qk, 1))", "m_new = tl.max(qk, 1)",
           "the new max forgets the old one: a block in which a causal row sees no key resets m to -inf "
           "and its log-sum-exp comes out -inf (and c > 1 can overflow)",
           _SEED_STATE + " (m_new = max(m, rowmax(S)))", ("causal_default_blocks", "batch_heads_mixed_causal"),
           edits=(("m_new = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)", "m_new = tl.min(qk, 1) * qk_scale"),
                  ("m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)", "m_new = tl.max(qk, 1) * qk_scale"))),
    Mutant("fast_path_max_ignores_sign", "fused",
           "            if NEGATIVE_SCALE:\n                m_new = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)\n"
           "            else:\n                m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)\n",
           "            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)\n",
           "the fast path takes max(raw score) * scale as the row max whatever the sign of the scale: with a "
           "negative scale that is the smallest scaled score, so exp2(s - m) overflows once scores are large",
           _OTHER + " (scaling after the row max, as the fused multiply-add form does)",
           ("negative_scale_large_scores",)),
    Mutant("exact_pass_never", "fused",
           "    if tl.max(big.to(tl.int32), 0) > 0:\n", "    if False:\n",
           "the exact second pass never runs: rows whose max reaches 2^24 keep the fused multiply-add's shift, "
           "which leaves the max score up to half an ulp of the row max off 0; past scores of ~3e8 exp2 "
           "overflows P (inf/NaN) or flushes a row to 0",
           _OTHER + " (measured on an H200: issue 13's inf/NaN at scores of 5e8 to 5e10 with fp fusion on)",
           ("huge_scores[fp16]", "extreme_scores_bf16"),
           gpu_only="the interpreter computes in NumPy, which never fuses a multiply and an add"),
    Mutant("exact_pass_fused", "fused",
           "        x = libdevice.mul_rn(qk, qk_scale)", "        x = qk * qk_scale",
           "the exact pass multiplies like the fused one: without a product rounded on its own, the compiler "
           "fuses it with the subtraction of the row max again, and fp32's one pass overflows like a fused one "
           "(fp16 and bf16 rerun their keys in the masked loop, where the score mask's select already stands "
           "between the multiply and the subtraction: there the GPU computes the same either way)",
           _OTHER + " (fp contraction: a plain multiply followed by a subtraction becomes one fused multiply-add)",
           ("extreme_scores_fp32",),
           gpu_only="the interpreter computes in NumPy, which never fuses a multiply and an add"),
    Mutant("big_rows_final_max_only", "fused",
           "big = big | (tl.abs(m_shift) >= 16777216.0)", "big = tl.abs(m_shift) >= 16777216.0",
           "only the last key block's row max decides whether the exact pass runs: a row whose first blocks "
           "score hugely negative (shift -7e8) and its last ones ordinarily overflows P in a first block, and "
           "the NaN that leaves in acc survives the rescale by 0",
           _OTHER + " (the running max only grows: the largest shift in magnitude may be the first)",
           ("huge_negative_first_keys",),
           gpu_only="the interpreter computes in NumPy, which never fuses a multiply and an add"),
    Mutant("big_rows_threshold_2_31", "fused",
           "big = big | (tl.abs(m_shift) >= 16777216.0)", "big = big | (tl.abs(m_shift) >= 2147483648.0)",
           "the exact pass is kept for rows past 2^31, where exp2 itself overflows: between 2^28 and 2^31 the "
           "fused shift still overflows P in fp16 (half an ulp there is 16 to 128)",
           _OTHER + " (the fp16 range of P: exp2 of more than 16 overflows it)", ("huge_scores[fp16]",),
           gpu_only="the interpreter computes in NumPy, which never fuses a multiply and an add"),
    Mutant("exp_instead_of_exp2", "fused",
           "c = tl.math.exp2(m_i - m_shift)\n        p = tl.math.exp2(qk)",
           "c = tl.exp(m_i - m_shift)\n        p = tl.exp(qk)",
           "exp instead of exp2 while the scores carry the log2(e) factor: the softmax runs at the wrong "
           "temperature",
           _OTHER + " (log2-domain softmax)", ("custom_scale", "one_query")),
    Mutant("log2e_missing", "fused",
           "q, k, v, o_dst, l_dst, scale * LOG2E,", "q, k, v, o_dst, l_dst, scale,",
           "the scale passed without the log2(e) factor into an exp2-based loop: the softmax runs at temperature "
           "1 / ln 2 everywhere (key blocks and split-KV combine alike), so every reference-free relation still "
           "holds and only the reference sees it",
           _OTHER + " (log2-domain softmax)", ("custom_scale", "one_query")),
    # --- scale -------------------------------------------------------------------------------------
    Mutant("scale_twice", "fused",
           "qk = _times_scale(qk, qk_scale, EXACT, MUL_RN)\n",
           "qk = _times_scale(qk, qk_scale, EXACT, MUL_RN) * qk_scale\n",
           "the softmax scale applied twice to the scores",
           _SEED_DECOMP + " (scale once)", ("custom_scale", "negative_scale"),
           edits=(("tl.min(qk, 1) * qk_scale)", "tl.min(qk, 1) * qk_scale * qk_scale)"),
                  ("tl.max(qk, 1) * qk_scale)", "tl.max(qk, 1) * qk_scale * qk_scale)"),
                  ("qk = _times_scale(qk, qk_scale, EXACT, MUL_RN) - m_shift",
                   "qk = _times_scale(qk, qk_scale, EXACT, MUL_RN) * qk_scale - m_shift"))),
    Mutant("scale_never", "fused",
           "            qk = _times_scale(qk, qk_scale, EXACT, MUL_RN)\n", "",
           "the softmax scale (and the log2(e) factor the loop's exp2 needs) never applied",
           _SEED_DECOMP + " (scale once)", ("custom_scale", "scale_zero"),
           edits=(("tl.min(qk, 1) * qk_scale)", "tl.min(qk, 1))"), ("tl.max(qk, 1) * qk_scale)", "tl.max(qk, 1))"),
                  ("qk = _times_scale(qk, qk_scale, EXACT, MUL_RN) - m_shift", "qk = qk - m_shift"))),
    # --- causal ------------------------------------------------------------------------------------
    Mutant("causal_no_masked_row_guard", "fused",
           'm_shift = tl.where(m_new == float("-inf"), 0.0, m_new)', "m_shift = m_new",
           "causal without the fully-masked-row guard: a row that sees no key computes -inf - (-inf) = NaN "
           "and divides 0 by 0 (Nq > Nk)",
           _SEED_CAUSAL, ("causal_nq_gt_nk", "causal_whole_blocks_masked"),
           edits=(("l_safe = tl.where(l_i == 0.0, 1.0, l_i)", "l_safe = l_i"),)),
    Mutant("masked_max_kept_as_zero", "fused",
           "        m_i = m_new  # guards: mutants m_never_updated,", "        m_i = m_shift  # guards: mutants m_never_updated,",
           "the guard's shift of a row that has seen no key yet (0, not -inf) kept as its running max: a key block "
           "wholly masked for a row (a window's left edge) makes 0 its max, which outranks every later score below "
           "it, so with scores far below exp's underflow every weight is 0 and the row 0 / 0 (vLLM's unified "
           "attention, found-bugs.md row 20)",
           _SEED_CAUSAL, ("window_very_negative_scores",)),
    Mutant("empty_row_zero_division", "fused",
           "l_safe = tl.where(l_i == 0.0, 1.0, l_i)", "l_safe = l_i",
           "only the final division unguarded: a causal row that sees no key outputs 0/0 = NaN instead of 0",
           _SEED_CAUSAL, ("causal_nq_gt_nk", "causal_whole_blocks_masked")),
    Mutant("causal_top_left", "fused",
           "<= offs_m[:, None] + right_shift)", "<= offs_m[:, None])",
           "causal mask aligned top-left (j <= i) instead of bottom-right (j <= i + Nk - Nq)",
           _CAUSAL_ALIGN, ("causal_nq_lt_nk", "causal_nq_gt_nk")),
    Mutant("causal_hi_block_n", "fused",
           "hi = tl.minimum(tl.maximum(start_m + BLOCK_M + right_shift, 0), Nk)",
           "hi = tl.minimum(tl.maximum(start_m + BLOCK_N + right_shift, 0), Nk)",
           "the causal loop bound counts BLOCK_N rows instead of BLOCK_M: with BLOCK_M > BLOCK_N the last rows "
           "of a query block never see their last keys",
           _OTHER + " (BLOCK_M and BLOCK_N confused in causal block skipping)",
           ("causal_block_m_gt_block_n",)),
    Mutant("causal_shift_sign", "fused",
           "causal_shift = Nk - Nq", "causal_shift = Nq - Nk",
           "causal diagonal shifted by Nq - Nk instead of Nk - Nq: wrong keys visible whenever Nq != Nk",
           _CAUSAL_ALIGN, ("causal_nq_lt_nk", "causal_nq_gt_nk")),
    # --- the store ---------------------------------------------------------------------------------
    Mutant("store_no_row_mask", "fused",
           "o_mask = (offs_m[:, None] < Nq) & (offs_dv[None, :] < HEAD_DIM_V)",
           "o_mask = offs_dv[None, :] < HEAD_DIM_V",
           "store without the row mask: the partial last query block writes past the output",
           _SEED_DECOMP + " (row mask on the store)", ("partial_last_query_block", "nq_lt_block_m")),
    Mutant("store_row_mask_off_by_one", "fused",
           "o_mask = (offs_m[:, None] < Nq)", "o_mask = (offs_m[:, None] <= Nq)",
           "store row mask admits row Nq: one row written past the output",
           _OTHER + " (index off-by-one)", ("partial_last_query_block", "nq_lt_block_m")),
    Mutant("lse_log2_domain", "fused",
           "(m_i + tl.math.log2(l_safe)) * 0.6931471805599453)", "(m_i + tl.math.log2(l_safe)))",
           "the log-sum-exp left in the loop's log2 domain (missing the factor ln 2)",
           "seed: The online-softmax state (finalize: L = m + log(l))", ("custom_scale", "one_query")),
    # --- batch, head and stride arithmetic ---------------------------------------------------------
    Mutant("int32_offsets", "fused",
           "q_base = Q + off_b.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh",
           "q_base = Q + off_b * stride_qz + off_h * stride_qh",
           "batch/head offsets in int32: past 2^31 elements they wrap negative and address memory before "
           "the tensor",
           _OTHER + " (int32 offset overflow)", ("offsets_over_2_31",),
           gpu_only="the overflow needs tensors of more than 2^31 elements, beyond the interpreter's memory "
                    "and time",
           edits=(("k_base = K + off_b.to(tl.int64) * stride_kz + off_hkv.to(tl.int64) * stride_kh",
                   "k_base = K + off_b * stride_kz + off_hkv * stride_kh"),
                  ("v_base = V + off_b.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh",
                   "v_base = V + off_b * stride_vz + off_hkv * stride_vh"),
                  ("o_base = Out + off_b.to(tl.int64) * stride_oz + off_h.to(tl.int64) * stride_oh",
                   "o_base = Out + off_b * stride_oz + off_h * stride_oh"))),
    Mutant("batch_head_swapped", "fused",
           "q_base = Q + off_b.to(tl.int64) * stride_qz + off_h.to(tl.int64) * stride_qh",
           "q_base = Q + off_h.to(tl.int64) * stride_qz + off_b.to(tl.int64) * stride_qh",
           "batch and head indices swapped in Q's offset: the wrong query rows are read (past the end of Q "
           "when H > B) whenever B != H",
           _STRIDES, ("batch_heads", "batch_heads_mixed_causal", "layout_bthd")),
    Mutant("k_batch_stride_from_q", "fused",
           "k_base = K + off_b.to(tl.int64) * stride_kz", "k_base = K + off_b.to(tl.int64) * stride_qz",
           "Q's batch stride used for K: batches past the first read the wrong keys whenever Nq != Nk",
           _STRIDES + " (one tensor's stride for another's)", ("batch_heads", "batch_heads_mixed_causal")),
    Mutant("v_strides_from_k", "fused",
           "*q.stride(), *k.stride(), *v.stride(), *out.stride()", "*q.stride(), *k.stride(), *k.stride(), *out.stride()",
           "K's strides passed for V: only visible when V is laid out differently from K",
           _STRIDES + " (one tensor's stride for another's)", ("layout_mixed", "batch_heads_mixed_causal")),
    Mutant("out_strides_from_q", "fused",
           "*q.stride(), *k.stride(), *v.stride(), *out.stride()", "*q.stride(), *k.stride(), *v.stride(), *q.stride()",
           "Q's strides used for the output: only visible when the output is laid out differently from Q",
           _STRIDES + " (one tensor's stride for another's)", ("layout_mixed",)),
    Mutant("kv_advance_wrong_stride", "fused",
           "k_ptrs += BLOCK_N * stride_kn", "k_ptrs += BLOCK_N * stride_vn",
           "the K pointers advance by V's row stride: from the second key block on, K is read at V's "
           "row pitch",
           _STRIDES + " (one tensor's stride for another's)", ("batch_heads_mixed_causal", "layout_mixed_many_keys")),
    Mutant("q_head_dim_stride_assumed_1", "fused",
           "q = q_base + q_rows[:, None] * stride_qm + offs_d[None, :] * stride_qk",
           "q = q_base + q_rows[:, None] * stride_qm + offs_d[None, :]",
           "Q's head-dim stride assumed to be 1: a Q with unit stride along N (a transposed view) is read "
           "wrongly",
           _STRIDES, ("layout_d_major",)),
    Mutant("query_block_from_wrong_axis", "fused",
           "m_block = tl.program_id(0) % m_blocks", "m_block = tl.program_id(0) // m_blocks",
           "the query block index decoded as the (batch, head) index from the one grid axis: every program of "
           "a head computes the same rows, and the others stay unwritten or are written past the queries "
           "(invisible when B = H = 1 with one query block)",
           _OTHER + " (wrong program-id axis)", ("batch_heads", "partial_last_query_block")),
    Mutant("causal_heaviest_first_off_by_one", "fused",
           "m_block = m_blocks - 1 - m_block", "m_block = m_blocks - m_block",
           "the causal launch order (a head's heaviest query block first) reversed without its -1: the first "
           "query block is never computed (its rows stay unwritten) and one program works past the last query",
           _OTHER + " (index reversal, as in load-balancing schedules)", ("causal_square", "causal_nq_gt_nk")),
    # --- the unfused baseline ----------------------------------------------------------------------
    Mutant("unfused_kv_mask_plus", "unfused",
           "k = tl.load(k_ptrs, mask=(offs_n[:, None] < Nk) & (offs_d[None, :] < head_dim), other=0.0)",
           "k = tl.load(k_ptrs, mask=(offs_n[:, None] < Nk) + (offs_d[None, :] < head_dim), other=0.0)",
           "unfused K and V load masks combined with +: V rows past Nk and K's padded head-dim columns are "
           "read out of bounds",
           _SEED_UNFUSED + " (+ instead of &)", ("partial_last_key_block", "head_dim_17", "nk_lt_block_n"),
           edits=(("mask=(cols[:, None] < Nk) & (offs_d[None, :] < head_dim)",
                   "mask=(cols[:, None] < Nk) + (offs_d[None, :] < head_dim)"),)),
    Mutant("unfused_softmax_flat_mask", "unfused",
           "col_ok = cols < Nk", "col_ok = row * Nk + cols < Nk",
           "the softmax mask compares the flat offset row * Nk + col with Nk: every row but the first is "
           "masked and left unnormalised",
           _SEED_UNFUSED + " (flat offset compared with a length)", ("partial_last_query_block", "batch_heads")),
    Mutant("unfused_no_normalise", "unfused",
           "p / l_safe, mask=col_ok", "p, mask=col_ok",
           "softmax rows not normalised: the weights do not sum to 1",
           _SEED_UNFUSED + " (check that each softmax row sums to 1)", ("one_query", "equal_scores")),
    Mutant("unfused_softmax_no_max", "unfused",
           "p = tl.exp(s - m_shift)", "p = tl.exp(s)",
           "softmax without subtracting the row max: exp overflows for large scores and underflows to 0/0 "
           "for very negative ones",
           "seed: The online-softmax state (m is the stability shift)", ("large_scores", "very_negative_scores")),
    Mutant("unfused_scores_nq_by_nq", "unfused",
           "s = torch.empty((B, H, Nq, Nk)", "s = torch.empty((B, H, Nq, Nq)",
           "scores buffer (Nq, Nq) and one length everywhere: keys past Nq are ignored (1 query vs 2 keys "
           "gives 5) and Nq > Nk reads keys past the end",
           _SEED_UNFUSED + " (wrong scores-buffer shape and lengths for cross-attention)",
           ("hand_one_query_two_keys", "cross_nq_lt_nk", "cross_nq_gt_nk"),
           edits=(("triton.cdiv(Nk, bn), B * H)](\n        q, k, s, scale, *q.stride(), *k.stride(), *s.stride(), H, Nq, Nk,",
                   "triton.cdiv(Nq, bn), B * H)](\n        q, k, s, scale, *q.stride(), *k.stride(), *s.stride(), H, Nq, Nq,"),
                  ("rows = s.view(B * H * Nq, Nk)", "rows = s.view(B * H * Nq, Nq)"),
                  ("*rows.stride(), Nk, BLOCK=triton.next_power_of_2(Nk))",
                   "*rows.stride(), Nq, BLOCK=triton.next_power_of_2(Nq))"),
                  ("*s.stride(), *v.stride(), *out.stride(), H, Nq, Nk,",
                   "*s.stride(), *v.stride(), *out.stride(), H, Nq, Nq,"))),
    # --- tensor descriptors (TMA) for K and V: fp16/bf16 in aligned layouts --------------------------
    Mutant("tma_no_alignment_check", "fused",
           "return (t.stride(3) == 1 and t.data_ptr() % 16 == 0\n"
           "            and all((st * size) % 16 == 0 for st in t.stride()[:3]))",
           "return t.stride(3) == 1",
           "tensor descriptors used whenever D has unit stride: a layout whose row stride is not a multiple of "
           "16 bytes (D + 3 elements) makes the descriptor fail on legal input instead of taking the pointer path",
           _TMA + " (TMA needs 16-byte strides)", ("half_unaligned_rows",)),
    Mutant("tma_desc_rows_nq", "fused",
           "TensorDescriptor(k, [B, Hkv, Nk, D]", "TensorDescriptor(k, [B, Hkv, Nq, D]",
           "the K/V descriptors declare Nq rows: with Nq < Nk the keys past Nq load as 0 (and score 0, not -inf); "
           "with Nq > Nk rows past Nk are read from the next head or the guard band",
           _TMA + " (one length for both)", ("half_descriptor_layout", "half_descriptor_nq_gt_nk"),
           edits=(("TensorDescriptor(v, [B, Hkv, Nk, Dv]", "TensorDescriptor(v, [B, Hkv, Nq, Dv]"),)),
    Mutant("tma_desc_padded_head_dim", "fused",
           "TensorDescriptor(k, [B, Hkv, Nk, D]", "TensorDescriptor(k, [B, Hkv, Nk, head_dim_block(D)]",
           "the K/V descriptors declare the padded head dim: the padded columns are read from the next row (and "
           "past the last row, from memory the tensor does not own) instead of as 0",
           _TMA + " (the padded head dim)", ("half_descriptor_layout",),
           edits=(("TensorDescriptor(v, [B, Hkv, Nk, Dv]", "TensorDescriptor(v, [B, Hkv, Nk, head_dim_block(Dv)]"),)),
    Mutant("tma_coords_batch_head_swapped", "fused",
           "x = desc.load([off_b, off_hkv, start_n, COL])", "x = desc.load([off_hkv, off_b, start_n, COL])",
           "batch and head coordinates swapped in the K/V descriptor loads: another head's keys are read, or "
           "zeros past B",
           _TMA + " (coordinates)", ("half_descriptor_layout",)),
    # --- fp32 at D = 128: the head dim in two halves (head_dim_split) ----------------------------------
    Mutant("d_split_second_half_same_columns", "fused",
           "k1 = _load_kv(k_ptrs + BLOCK_D * stride_kk,", "k1 = _load_kv(k_ptrs,",
           "the second half of the head dim reads K's first half again: S = Q_0 K_0^T + Q_1 K_0^T",
           _D_SPLIT, ("fp32_precision", "head_dim_111")),
    Mutant("d_split_second_half_not_rescaled", "fused",
           "acc1 = _mma(p.to(v1.dtype), v1, acc1 * c[:, None],", "acc1 = _mma(p.to(v1.dtype), v1, acc1,",
           "the output's second half is not rescaled when the running max grows (the first half is): old key "
           "blocks are over-weighted in columns 64..127 only",
           _D_SPLIT, ("many_key_chunks_growing_max_d128",)),
    Mutant("d_split_column_mask_unshifted", "fused",
           "offs_d = COL + tl.arange(0, BLOCK_D)", "offs_d = tl.arange(0, BLOCK_D)",
           "the head-dim mask of the second half ignores its column offset: columns past D (111..127) are read, "
           "from the next row and, past the last row, from memory the tensor does not own",
           _D_SPLIT, ("head_dim_111",)),
    Mutant("q_in_loop_columns_unclamped", "fused",
           "q1_cols = tl.minimum(offs_d1, HEAD_DIM - 1)", "q1_cols = offs_d1",
           "the second head-dim half of the re-read Q tile is read at its padded columns (111..127): the next "
           "row's values and, past the last row, memory the tensor does not own",
           _D_SPLIT + " (Q re-read in the loop)", ("head_dim_111",), entry="attention_tf32x3"),
    Mutant("unfused_scores_unwritten", "unfused",
           "triton.cdiv(Nk, bn), B * H)]", "Nk // bn, B * H)]",
           "the scores grid's key axis rounds down: the partial last key tile is never written and the "
           "softmax reads what the buffer held. The buffer is zero-filled here so that the unwritten "
           "entries are deterministic: torch.empty could hand back the stale scores of the reference run "
           "and hide the bug by chance",
           _SEED_UNFUSED + " (uninitialized buffer)", ("partial_last_key_block", "nk_lt_block_n", "batch_heads_d64[fp16]"),
           edits=(("s = torch.empty((B, H, Nq, Nk)", "s = torch.zeros((B, H, Nq, Nk)"),)),
    Mutant("unfused_causal_top_left", "unfused",
           "offs_n[None, :] <= offs_m[:, None] + (Nk - Nq), s,", "offs_n[None, :] <= offs_m[:, None], s,",
           "unfused causal mask aligned top-left instead of bottom-right",
           _CAUSAL_ALIGN, ("causal_nq_lt_nk", "causal_nq_gt_nk")),
    # ---- protocol v3's optional features (cases/features.py): the head map, V's own head dim, the window's
    # edges and block skipping, the softcap's form and place, ALiBi's sign, distance and slopes ----
    Mutant('gqa_interleaved_map', 'fused',
           'off_hkv = off_h // KV_GROUP',
           'off_hkv = off_h % (H // KV_GROUP)',
           'query head h reads kv head h % Hkv (the interleaved map) instead of h // (Hq // Hkv): right only for '
           'MQA (Hkv = 1) and Hq == Hkv',
           'protocol v3: GQA/MQA',
           ('gqa_groups_of_three', 'gqa_groups_of_four_causal', 'every_feature_at_once')),
    Mutant('gqa_group_inverted', 'fused',
           'KV_GROUP=H // Hkv,',
           'KV_GROUP=max(1, Hkv // H),',
           'the group size computed as Hkv // Hq (clamped to 1): every query head reads the kv head of its own '
           "index, past Hkv into the next batch's heads (or past the tensor)",
           'protocol v3: GQA/MQA',
           ('gqa_groups_of_three', 'gqa_groups_of_four_causal', 'mqa_decode')),
    Mutant('gqa_v_reads_query_head', 'fused',
           'v_base = V + off_b.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh',
           'v_base = V + off_b.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh',
           "the head map applied to K but not to V: V is read at the query head's index (the pointer path; "
           'descriptor loads take their own coordinates)',
           'protocol v3: GQA/MQA',
           ('gqa_groups_of_three', 'gqa_groups_of_four_causal', 'mqa_decode')),
    Mutant('gqa_group_from_batch', 'fused',
           'KV_GROUP=H // Hkv,',
           'KV_GROUP=H // k.shape[0],',
           "the group size from k's batch dim (shape[0]) instead of its head dim: right only where B == Hkv",
           'protocol v3: GQA/MQA',
           ('gqa_groups_of_four_causal', 'mqa_decode', 'every_feature_at_once')),
    Mutant('dv_load_mask_head_dim', 'fused',
           'v = _load_kv(v_ptrs, desc_v, off_b, off_hkv, start_n, kv_rows, 0, BLOCK_N, BLOCK_DV, HEAD_DIM_V, MASKED,',
           'v = _load_kv(v_ptrs, desc_v, off_b, off_hkv, start_n, kv_rows, 0, BLOCK_N, BLOCK_DV, HEAD_DIM, MASKED,',
           "V's load masked with Q/K's head dim D: with Dv > D the columns past D load as 0",
           'protocol v3: Dv != D',
           ('dv_larger_odd_causal', 'dv_split_decode', 'every_feature_at_once')),
    Mutant('dv_block_from_d', 'fused',
           'BLOCK_DV=head_dim_block(Dv) // (2 if d_split else 1)',
           'BLOCK_DV=head_dim_block(D) // (2 if d_split else 1)',
           "V's and the output's block sized by D: with Dv > the padded D the columns past it are never computed "
           'nor stored',
           'protocol v3: Dv != D',
           ('dv_larger_odd_causal', 'dv_split_decode', 'every_feature_at_once')),
    Mutant('dv_descriptor_shape_from_d', 'fused',
           'TensorDescriptor(v, [B, Hkv, Nk, Dv]',
           'TensorDescriptor(v, [B, Hkv, Nk, D]',
           "V's tensor descriptor declares K's head dim: with Dv > D, TMA zero-fills V's columns past D",
           'protocol v3: Dv != D',
           ('dv_half_descriptor',)),
    Mutant('dv_split_partial_row_stride', 'fused',
           'tl.store(Out + row[:, None] * HEAD_DIM_V + offs_dv[None, :]',
           'tl.store(Out + row[:, None] * HEAD_DIM + offs_dv[None, :]',
           'split-KV partial outputs stored with rows of D columns while the combine reads rows of Dv',
           'protocol v3: Dv != D',
           ('dv_split_decode',)),
    Mutant('window_left_off_by_one', 'fused',
           '>= offs_m[:, None] + left_shift)',
           '> offs_m[:, None] + left_shift)',
           "the window's left side exclusive: each row loses its leftmost key",
           'protocol v3: sliding windows',
           ('window_hand_4x4', 'window_hand_bottom_right', 'window_diagonal_only')),
    Mutant('window_right_off_by_one', 'fused',
           'right_shift = causal_shift + window_right\n',
           'right_shift = causal_shift + window_right + 1\n',
           "the window's right side counted one too far: each row sees one key past it",
           'protocol v3: sliding windows',
           ('window_crossing_key_blocks', 'window_rows_see_nothing', 'every_feature_at_once')),
    Mutant('window_left_top_left', 'fused',
           'left_shift = causal_shift - window_left',
           'left_shift = -window_left',
           "the window's left side counted from the top-left diagonal (j >= i - left) while the causal side is "
           'bottom-right: wrong keys whenever Nq != Nk',
           'protocol v3: sliding windows',
           ('window_hand_bottom_right', 'window_keys_from_the_diagonal', 'window_crossing_key_blocks')),
    Mutant('window_lead_block_unmasked', 'fused',
           'full_lo = tl.minimum((tl.maximum(start_m + BLOCK_M - 1 + left_shift, 0) + BLOCK_N - 1) // BLOCK_N * '
           'BLOCK_N,',
           'full_lo = tl.minimum(tl.maximum(start_m + BLOCK_M - 1 + left_shift, 0) // BLOCK_N * BLOCK_N,',
           "the first fully-seen block rounded down: the block holding the last row's first key runs on the "
           'unmasked fast path, so that row sees keys left of its window',
           'protocol v3: sliding windows',
           ('window_crossing_key_blocks',)),
    Mutant('window_lo_skips_partial_block', 'fused',
           'lo = tl.maximum(start_m + left_shift, 0) // BLOCK_N * BLOCK_N',
           'lo = (tl.maximum(start_m + left_shift, 0) + BLOCK_N - 1) // BLOCK_N * BLOCK_N',
           "the first visited block rounded up: the partial block at the first row's left edge is skipped",
           'protocol v3: sliding windows',
           ('window_crossing_key_blocks',)),
    Mutant('softcap_textbook_tanh', 'fused',
           'e = tl.math.exp2(-2.8853900817779268 * tl.abs(x))',
           'e = tl.math.exp2(2.8853900817779268 * x)',
           'tanh as (e^2x - 1) / (e^2x + 1): inf / inf = NaN once |s / c| passes ~44',
           'protocol v3: logit softcapping',
           ('softcap_tanh_region',),
           edits=(
                  ('t = (1.0 - e) / (1.0 + e)',
                   't = (e - 1.0) / (e + 1.0)'),
                  ('return cap * tl.where(x < 0, -t, t)',
                   'return cap * t'),)),
    Mutant('softcap_ratio_times_tanh', 'fused',
           'return cap * tl.where(x < 0, -t, t)',
           'return x * tl.where(x < 0, -t, t)',
           'the capped score as (s / c) tanh(s / c)',
           'protocol v3: logit softcapping',
           ('softcap_tanh_region', 'softcap_negative_scale', 'softcap_before_the_masks')),
    Mutant('softcap_after_mask', 'fused',
           '            if SOFTCAP:\n                # c tanh(s / c) of the scaled score, BEFORE the masks (a '
           'capped -inf would be a finite -c) and\n                # before the bias. guards: mutant '
           'softcap_after_mask\n                qk = _softcap(qk, softcap)\n',
           '',
           'the softcap applied after the masks (and the bias): a masked -inf becomes -c, so keys past Nk and '
           'outside the causal/window mask get weight',
           'protocol v3: logit softcapping',
           ('softcap_tanh_region', 'softcap_negative_scale', 'softcap_before_the_masks'),
           edits=(
                  ('                qk = tl.where(valid, qk, float("-inf"))\n',
                   '                qk = tl.where(valid, qk, float("-inf"))\n            if SOFTCAP:\n             '
                   '   qk = _softcap(qk, softcap)\n'),)),
    Mutant('softcap_natural_units', 'fused',
           'softcap_log2 = None if softcap is None else softcap * LOG2E',
           'softcap_log2 = softcap',
           'the cap passed in natural units into the log2-domain loop: scores capped at c ln 2',
           'protocol v3: logit softcapping',
           ('softcap_tanh_region', 'softcap_negative_scale', 'softcap_before_the_masks')),
    Mutant('varlen_rows_from_max_seqlen', 'fused',
           '        Nq = (tl.load(CuQ + off_b + 1) - q_start).to(tl.int32)\n',
           '',
           "packed sequences' query rows bounded by the longest sequence (the grid's max_seqlen_q), not their own "
           "length: a short sequence's blocks read the next sequence's queries and store into its rows",
           'issue 31: packed sequences (a zero-length sequence writing into the next one)',
           ('varlen_empty_sequences',), entry="attention_varlen",
           strays="stores past the packed output's last row and the wrapper's own lse"),
    Mutant('varlen_keys_from_max_seqlen', 'fused',
           '        Nk = (tl.load(CuK + off_b + 1) - k_start).to(tl.int32)\n',
           '',
           "packed sequences' keys bounded by the longest key sequence: a short sequence attends to the next "
           "sequence's keys (and the causal diagonal moves with the wrong Nk)",
           'issue 31: packed sequences (a block past the key length reading the next sequence)',
           ('varlen_cross_causal', 'varlen_block_edges'), entry="attention_varlen"),
    Mutant('varlen_key_start_from_q', 'fused',
           'k_start = tl.load(CuK + off_b).to(tl.int64)',
           'k_start = tl.load(CuQ + off_b).to(tl.int64)',
           "each sequence's keys start at its query offset: right only when every sequence has Nq == Nk",
           'issue 31: packed sequences (cu_seqlens_q used for k)',
           ('varlen_cross_causal',), entry="attention_varlen"),
    Mutant('varlen_lse_rows_padded', 'fused',
           'l_ptrs += q_start * stride_lm',
           'l_ptrs += off_b.to(tl.int64) * (tl.cdiv(Nq, BLOCK_M) * BLOCK_M) * stride_lm',
           "the log-sum-exp rows of sequence b placed at b times its length rounded up to a block: one sequence's "
           "lse lands in another's rows",
           'issue 31: packed sequences (an lse scratch indexed by the rounded-up length)',
           ('varlen_block_edges', 'varlen_empty_sequences'), entry="attention_varlen",
           strays="stores past the end of the lse the wrapper allocates",
           gpu_only="the interpreter's stray stores land in the host heap it shares with the oracle: whether they "
                    "crash the process, leave the displaced rows for the oracle or overwrite what it compares "
                    "depends on that heap's layout (it passed the whole oracle from one checkout's path and was "
                    "killed from another)"),
    Mutant('paged_keys_from_max_seqlen', 'fused',
           '        Nk = tl.load(Seqlens + off_b)\n',
           '',
           "every batch of a paged cache read to the longest cache length: a shorter sequence takes the slots past "
           "its keys (stale or NaN) and its causal diagonal moves",
           'issue 31: paged KV caches (cache_seqlens ignored)',
           ('paged_decode_page_16', 'paged_page_size_1'), entry="attention_paged",
           strays="reads table entries and pages past a sequence's own"),
    Mutant('paged_pages_assumed_contiguous', 'fused',
           'page = tl.load(table + rows // page_size, mask=rows < Nk, other=0).to(tl.int64)',
           'page = (tl.load(table) + rows // page_size).to(tl.int64)',
           "the pages of a sequence assumed consecutive in the pool (its first page plus the page number): wrong "
           "for any shuffled pool",
           'issue 31: paged KV caches (a contiguous page pool assumed)',
           ('paged_decode_page_16', 'paged_odd_page_size'), entry="attention_paged",
           strays="reads pages past the end of the pool"),
    Mutant('paged_slot_from_block', 'fused',
           'page = tl.load(table + rows // page_size, mask=rows < Nk, other=0).to(tl.int64)',
           'page = tl.load(table + (rows * 0 + tl.min(rows, 0)) // page_size, mask=rows < Nk, other=0).to(tl.int64)',
           "one page looked up per block of keys (its first key's): a block that crosses a page boundary reads the "
           "rest of its keys from the wrong page (right only when the page size is a multiple of the tile)",
           'issue 31: paged KV caches (a tile crossing a page boundary)',
           ('paged_odd_page_size', 'paged_page_size_1'), entry="attention_paged"),
    Mutant('paged_table_row_stride_from_b', 'fused',
           'table = Table + off_b.to(tl.int64) * stride_tb',
           'table = Table + off_b.to(tl.int64)',
           "the block table's row of batch b taken at b, not b times its row stride: every batch but the first "
           "reads another row's pages",
           'issue 31: paged KV caches (a block-table index with the wrong stride)',
           ('paged_decode_page_16', 'paged_page_size_1'), entry="attention_paged",
           strays="reads table entries of other rows, which may point outside the pool"),
    Mutant('alibi_sign', 'fused',
           'qk = qk - alibi * tl.abs(',
           'qk = qk + alibi * tl.abs(',
           'the bias added with the wrong sign: far keys weigh more',
           'protocol v3: ALiBi',
           ('alibi_heads_causal', 'alibi_batch_heads_cross', 'every_feature_at_once')),
    Mutant('alibi_top_left', 'fused',
           'tl.abs(offs_m[:, None] + causal_shift - (start_n + offs_n)[None, :])',
           'tl.abs(offs_m[:, None] - (start_n + offs_n)[None, :])',
           'the distance counted from the top-left diagonal |i - j|: wrong whenever Nq != Nk',
           'protocol v3: ALiBi',
           ('alibi_batch_heads_cross', 'every_feature_at_once')),
    Mutant('alibi_no_abs', 'fused',
           'tl.abs(offs_m[:, None] + causal_shift - (start_n + offs_n)[None, :]).to(tl.float32)',
           '(offs_m[:, None] + causal_shift - (start_n + offs_n)[None, :]).to(tl.float32)',
           'the signed distance i + Nk - Nq - j (right for causal rows only): keys right of the diagonal get a bonus',
           'protocol v3: ALiBi',
           ('alibi_batch_heads_cross', 'every_feature_at_once')),
    Mutant('alibi_batch_slopes_ignored', 'fused',
           'alibi = tl.load(Alibi + off_b.to(tl.int64) * stride_az + off_h.to(tl.int64) * stride_ah)',
           'alibi = tl.load(Alibi + off_h.to(tl.int64) * stride_ah)',
           'the slope read by head only: right for (Hq,) slopes, wrong for (B, Hq)',
           'protocol v3: ALiBi',
           ('alibi_batch_heads_cross',)),
    Mutant('alibi_natural_units', 'fused',
           '* stride_ah) * 1.4426950408889634',
           '* stride_ah)',
           'the slope used in natural units in the log2-domain loop (missing log2 e)',
           'protocol v3: ALiBi',
           ('alibi_heads_causal', 'alibi_batch_heads_cross', 'every_feature_at_once')),
    Mutant('unfused_gqa_v_reads_query_head', 'unfused',
           'v_base = V + off_b.to(tl.int64) * stride_vz + off_hkv.to(tl.int64) * stride_vh',
           'v_base = V + off_b.to(tl.int64) * stride_vz + off_h.to(tl.int64) * stride_vh',
           "unfused P.V reads V at the query head's index",
           'protocol v3: GQA/MQA',
           ('gqa_groups_of_three', 'gqa_groups_of_four_causal', 'mqa_decode')),
    Mutant('unfused_window_left_off_by_one', 'unfused',
           'offs_n[None, :] >= offs_m[:, None] + (Nk - Nq) - window_left',
           'offs_n[None, :] > offs_m[:, None] + (Nk - Nq) - window_left',
           "unfused window's left side exclusive",
           'protocol v3: sliding windows',
           ('window_hand_4x4', 'window_hand_bottom_right', 'window_diagonal_only')),
    Mutant('unfused_softcap_textbook_tanh', 'unfused',
           'e = tl.exp(-2.0 * tl.abs(x))',
           'e = tl.exp(2.0 * x)',
           'unfused tanh as (e^2x - 1) / (e^2x + 1)',
           'protocol v3: logit softcapping',
           ('softcap_tanh_region',),
           edits=(
                  ('t = (1.0 - e) / (1.0 + e)',
                   't = (e - 1.0) / (e + 1.0)'),
                  ('s = softcap * tl.where(x < 0, -t, t)',
                   's = softcap * t'),)),
    Mutant('unfused_alibi_top_left', 'unfused',
           'tl.abs(offs_m[:, None] + (Nk - Nq) - offs_n[None, :])',
           'tl.abs(offs_m[:, None] - offs_n[None, :])',
           'unfused ALiBi distance counted top-left',
           'protocol v3: ALiBi',
           ('alibi_batch_heads_cross', 'every_feature_at_once')),
]

BY_NAME = {m.name: m for m in MUTANTS}
assert len(BY_NAME) == len(MUTANTS), "mutant names must be unique"


def get(name):
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no mutant named {name!r}") from None


def markdown():
    """The corpus as a markdown table (docs/mutants.md)."""
    lines = ["| name | kernel | breaks | origin | backend | killers |", "| --- | --- | --- | --- | --- | --- |"]
    for m in MUTANTS:
        backend = f"GPU only: {m.gpu_only}" if m.gpu_only else "CPU and GPU"
        cells = [f"`{m.name}`", m.module, m.breaks, m.origin, backend, ", ".join(f"`{k}`" for k in m.killers)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
