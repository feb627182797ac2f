"""References for the attention protocol: ``numpy_ref`` (float64, the oracle of record) and ``torch_ref``
(any dtype: the same-precision baseline that tolerances are derived from)."""
