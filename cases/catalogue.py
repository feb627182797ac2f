"""The case catalogue: every named case, the bug it guards against, and where that bug comes from.

"seed" refers to the technical note the project comes from, restated in docs/design.md ("The seed's
requirements"; sections: Decomposition, online-softmax state,
rescale direction, Masks and sentinels, tl.dot constraints, Verification checklist, unfused baseline).
Block sizes pinned here reach only kernels that accept block_m/block_n; every bug class is also reached
through shape variety alone (awkward lengths, cross-attention, many keys), so foreign kernels are judged
on the same classes.

To add a regression: paste the Case(...) line a failure printed (its `repro`), give it a name and a `why`.
"""
from flashcheck.cases.case import Case
from flashcheck.cases.projection import check_points

_DIM_WHY = {
    1: "D = 1: the head-dim block is padded to 16; padded columns must be exact (seed: tl.dot constraints)",
    2: "D = 2: next_power_of_2 gives 2, below tl.dot's minimum of 16 (seed: tl.dot constraints; GPU compile)",
    3: "D = 3: non-power-of-two head dim, padding masked on load and store (seed: head-dim padding)",
    16: "D = 16: the dot minimum exactly, no padding",
    17: "D = 17: one past 16; a head-dim block hard-coded to 16 truncates it (seed: do not hard-code 16)",
    59: "D = 59: odd head dim, as in FlashAttention's tests",
    64: "D = 64: common head dim",
    111: "D = 111: odd head dim near 128",
    128: "D = 128: common head dim",
    256: "D = 256: the largest supported head dim",
}

# what each head-dim entry is about: that head dim itself, or a kind of head dim the nearest declared one can have
_DIM_POINT = {1: ('head_dim',), 2: ('head_dim',), 3: ('head_dim',), 16: ('head_dim',), 17: ('head_dim_past_16',), 59: ('odd_head_dim',), 64: ('head_dim',), 111: ('odd_head_dim',), 128: ('head_dim',), 256: ('head_dim',)}

CATALOGUE = [
    Case("hand_one_query_two_keys", point=('lengths',),
         why="one length for queries and keys: 1 query vs keys [1, 1] and values [5, 10] gave 5 (seed: "
             "cross-attention). The answer is exactly 7.5",
         Nq=1, Nk=2, D=1, data="explicit", q=((1.0,),), k=((1.0,), (1.0,)), v=((5.0,), (10.0,)),
         expected=((7.5,),), exact=True),
    Case("partial_last_query_block", point=('partial_query_block',),
         why="the last query block is partial: the store needs the row mask (out-of-bounds write), the Q load "
             "needs it too (seed: Decomposition, store with row mask)",
         Nq=37, Nk=32, D=32, block_m=16, block_n=16, seed=1),
    Case("partial_last_key_block", point=('partial_key_block',),
         why="the last key block is partial: K/V load mask and -inf score mask on keys >= Nk (seed: Masks and "
             "sentinels)",
         Nq=32, Nk=45, D=32, block_m=16, block_n=16, seed=2),
    Case("nq_lt_block_m", point=('few_queries',), why="fewer query rows than one block: every row mask matters",
         Nq=5, Nk=40, D=16, seed=3),
    Case("nk_lt_block_n", point=('few_keys',), why="fewer keys than one block: the only key block is partial",
         Nq=40, Nk=7, D=16, seed=4),
    *[Case(f"head_dim_{d}", point=_DIM_POINT[d], why=_DIM_WHY[d], Nq=19, Nk=23, D=d, seed=10 + d)
      for d in sorted(_DIM_WHY)],
    Case("cross_nq_gt_nk", point=('nq_gt_nk',),
         why="cross-attention, Nq > Nk: grid, row mask, store use Nq; loop, K/V mask, score mask use Nk (seed)",
         Nq=48, Nk=20, D=16, block_m=16, block_n=16, seed=6),
    Case("cross_nq_lt_nk", point=('nq_lt_nk',), why="cross-attention, Nq < Nk: the loop must run over all Nk keys (seed)",
         Nq=20, Nk=53, D=16, block_m=16, block_n=16, seed=7),
    Case("block_m_gt_block_n", point=('nq_ne_nk',),
         why="BLOCK_M != BLOCK_N: square tiles hide broadcast-axis bugs, e.g. a score mask along the wrong "
             "axis (seed: verification checklist)",
         Nq=40, Nk=50, D=16, block_m=32, block_n=16, seed=8),
    Case("block_m_lt_block_n", point=('nq_ne_nk',), why="BLOCK_M < BLOCK_N, the other way round (seed: verification checklist)",
         Nq=40, Nk=50, D=16, block_m=16, block_n=32, seed=9),
    Case("many_key_chunks", point=('many_key_blocks',),
         why="ten key chunks: the running max, denominator and accumulator are rescaled many times (seed: "
             "rescale direction; a case with several key chunks)",
         Nq=20, Nk=150, D=16, block_m=16, block_n=16, seed=10),
    Case("many_key_chunks_growing_max", point=('many_key_blocks', 'scale'),
         why="scores grow along the keys, so the running max changes in every chunk: a wrong or missing "
             "rescale of l or acc cannot hide",
         Nq=16, Nk=130, D=16, block_m=16, block_n=16, data="randn", seed=11, scale=3.0),
    Case("many_key_chunks_growing_max_d128", point=('many_key_blocks', 'scale', 'head_dim_past_64'),
         why="many_key_chunks_growing_max at D = 128: a kernel that works on the head dim in parts (two halves of "
             "64 columns, each with its own accumulator) must rescale every part",
         Nq=16, Nk=130, D=128, block_m=16, block_n=16, data="randn", seed=70, scale=0.5),
    Case("one_key", point=('one_key',), why="one key: the output is exactly that key's value row", Nq=9, Nk=1, D=8,
         expected="v_row0", seed=12),
    Case("one_query", point=('one_query', 'nq_lt_nk'), why="one query row against many keys", Nq=1, Nk=50, D=32, seed=13),
    Case("large_scores",
         why="raw scores about +-1e4: exp overflows unless the running max is subtracted (online softmax)",
         Nq=33, Nk=40, D=32, data="large", seed=14),
    Case("very_negative_scores",
         why="every raw score about -1e4: exp underflows and gives 0/0 unless the max is subtracted",
         Nq=33, Nk=40, D=32, data="very_negative", seed=15),
    Case("masked_keys_below_finite_masks", point=('causal', 'nq_lt_nk', 'partial_key_block'),
         why="every visible score below -1e9 (scaled; about -1.02e9 in fp16 at D = 16), rising along the keys: a "
             "causal mask, or the padding past Nk, written as a large finite value instead of -inf (-1e4, -65504, "
             "-1e9, as kernels do) lets masked keys outscore every visible one. Other cases' scores sit far above "
             "such values, so only rows that see no key showed the bug",
         Nq=24, Nk=45, D=16, causal=True, data="below_finite_masks", seed=138),
    Case("equal_scores", why="all scores of a row equal: the output is the mean of V (hand value)",
         Nq=21, Nk=37, D=16, data="equal_scores", expected="mean_v", seed=16),
    Case("scale_zero", point=('scale',), why="scale = 0 makes every score 0: the output is the mean of V (hand value)",
         Nq=21, Nk=37, D=16, scale=0.0, expected="mean_v", seed=17),
    Case("custom_scale", point=('scale',), why="a caller's scale replaces 1/sqrt(D), applied exactly once", Nq=24, Nk=30, D=32,
         scale=0.3, seed=18),
    Case("negative_scale", point=('scale',), why="a negative scale flips the softmax; nothing may assume scale > 0",
         Nq=24, Nk=30, D=32, scale=-0.7, seed=19),
    Case("large_scores_whole_blocks", point=('several_key_blocks',),
         why="raw scores of about +-1e4 over whole key blocks: the unmasked fast path's running max must be "
             "the true row max, or exp2 overflows",
         Nq=20, Nk=130, D=32, data="large", block_m=32, block_n=32, seed=45),
    Case("negative_scale_large_scores", point=('scale', 'several_key_blocks'),
         why="a negative scale with raw scores of about +-1e4, over whole key blocks (the unmasked fast path): "
             "the row max of the scaled scores is the scaled MIN of the raw ones",
         Nq=20, Nk=130, D=32, data="large", scale=-0.25, block_m=32, block_n=32, seed=44),
    Case("huge_scores", point=('several_key_blocks',),
         why="|q.k| of about 2e9, the largest that fp16 inputs hold (scaled scores up to ~7e8), over whole key "
             "blocks: the max score minus the row max must be exactly 0; a fused multiply-add leaves up to half "
             "an ulp of the score (dozens), and exp2 of it overflows P in fp16",
         Nq=40, Nk=130, D=128, data="large", magnitude=2e9, block_m=32, block_n=32, seed=61),
    Case("huge_scores_negative_scale", point=('scale', 'several_key_blocks'), why="huge_scores with a negative scale: the row max is the scaled min",
         Nq=40, Nk=130, D=128, data="large", magnitude=2e9, scale=-0.08838834764831845, block_m=32, block_n=32,
         seed=62),
    Case("huge_negative_first_keys", point=('several_key_blocks',),
         why="the first 150 keys score about -4e9 with every query (scaled about -7e8), the other 150 as randn "
             "does: the running max starts hugely negative and ends ordinary, so a check of the last row max "
             "alone misses the first blocks, where a fused multiply-add shift overflows P",
         Nq=40, Nk=300, D=64, dtype="half", data="negative_first_keys", magnitude=4e9, block_m=32, block_n=32,
         seed=65),
    Case("extreme_scores_fp32", point=('several_key_blocks',),
         why="|q.k| of about 1e36, near where fp32 scores end: any slack in the subtraction of the row max is "
             "thousands of ulps of exp2's input (inf, or a row of zeros)",
         Nq=40, Nk=130, D=64, dtype="fp32", data="large", magnitude=1e36, block_m=32, block_n=32, seed=63),
    Case("extreme_scores_bf16", point=('scale', 'several_key_blocks'), why="extreme_scores_fp32 in bf16 (the same exponent range), with a negative scale",
         Nq=40, Nk=130, D=64, dtype="bf16", data="large", magnitude=1e36, scale=-0.125, block_m=32, block_n=32,
         seed=64),
    Case("fp16_many_key_blocks", point=('long_rows',),
         why="fp16 over 512 key blocks: the running state (l, acc) must stay fp32 between blocks; rounded to "
             "fp16 at each block, V = 1 drifts from 1 by 2^-8",
         Nq=32, Nk=8192, D=16, dtype="half", block_m=16, block_n=16, seed=55),
    Case("large_accumulator", point=("long_rows",),
         why="4096 keys scoring alike and values about 64: the unnormalised sums reach l ~ 1700 and acc ~ 1.1e5, "
             "past fp16's largest value (65504), while the output stays about 64; a kernel that keeps its running "
             "P.V sum (or rounds it) in fp16 overflows to inf (FlashAttention keeps them in fp32 for this), and in "
             "bf16 rounds it to 8 bits. 20 queries: past a split-KV kernel's decode threshold, so one program sums "
             "every key",
         Nq=20, Nk=4096, D=16, data="large_sums", seed=72),
    Case("large_values_fp16", point=("several_key_blocks",),
         why="values about 8000 (legal fp16) under keys that score alike: one block's P.V reaches 1e5 from 32 keys "
             "on, past fp16's 65504 while the output stays about 8000; a dot whose output is fp16 (a half "
             "accumulator, or a block's partial product rounded before the fp32 sum) overflows to inf",
         Nq=20, Nk=256, D=16, dtype="fp16", data="large_sums", magnitude=8000.0, seed=144),
    Case("bf16_values_past_fp16_range", point=("several_key_blocks",),
         why="bf16 values about 1e5, past fp16's 65504 (bf16 holds up to 3e38): a kernel written for fp16 that "
             "casts V (or P.V, or the output) to fp16 for every half dtype is exact in bf16 on ordinary values, "
             "and gives inf here",
         Nq=20, Nk=256, D=16, dtype="bf16", data="large_sums", magnitude=1e5, seed=145),
    Case("causal_block_m_gt_block_n", point=('causal', 'queries_past_128'),
         why="causal with BLOCK_M > BLOCK_N (the GPU's default tiles are 128 x 64): the last key a query block "
             "sees is bounded by its BLOCK_M rows, not by BLOCK_N (200 rows: past one 128-row block)",
         Nq=200, Nk=200, D=16, causal=True, block_m=32, block_n=16, seed=56),
    Case("causal_square", point=('causal',), why="causal, Nq == Nk: the usual lower triangle (block diagonal masking)",
         Nq=45, Nk=45, D=16, causal=True, block_m=16, block_n=16, seed=20),
    Case("causal_nq_lt_nk", point=('causal', 'nq_lt_nk'),
         why="causal, Nq < Nk: bottom-right alignment, query i sees keys j <= i + Nk - Nq (FlashAttention)",
         Nq=20, Nk=53, D=16, causal=True, block_m=16, block_n=16, seed=21),
    Case("causal_nq_gt_nk", point=('sees_no_key',),
         why="causal, Nq > Nk: the first Nq - Nk rows see no key and must give 0 (lse -inf), never NaN",
         Nq=53, Nk=20, D=16, causal=True, block_m=16, block_n=16, seed=22),
    Case("causal_whole_blocks_masked", point=('whole_blocks_see_no_key',),
         why="causal, Nq >> Nk: whole query blocks see no key (the loop runs zero times)",
         Nq=70, Nk=5, D=16, causal=True, block_m=16, block_n=16, seed=23),
    Case("causal_default_blocks", point=('causal',), why="causal with the kernel's own block sizes, awkward lengths",
         Nq=77, Nk=93, D=24, causal=True, seed=24),
    Case("layout_bthd", point=('layout',), why="BTHD storage viewed as BHTD: heads and rows swap strides", B=2, H=3, Nq=19,
         Nk=23, D=16, layout="bthd", seed=25),
    Case("layout_gapped", point=('layout',), why="gaps between rows and heads: strides are not shape products", B=2, H=3,
         Nq=19, Nk=23, D=16, layout="gapped", seed=26),
    Case("layout_d_major", point=('layout',), why="unit stride along N, not D: no kernel may assume stride_d == 1", B=2, H=2,
         Nq=19, Nk=23, D=16, layout="d_major", seed=27),
    Case("layout_mixed", point=('layout',),
         why="q, k, v, out each in a different layout: one tensor's strides used for another's show",
         B=2, H=3, Nq=19, Nk=23, D=16, layout="mixed", seed=28),
    Case("batch_heads", point=('batch_heads',), why="B > 1 and H > 1 with B != H: batch and head offsets must not be swapped",
         B=2, H=3, Nq=17, Nk=21, D=16, seed=29),
    Case("batch_heads_mixed_causal", point=('batch_heads', 'layout', 'causal', 'nq_gt_nk'), why="batch, heads, mixed layouts and causal cross-attention together",
         B=3, H=2, Nq=29, Nk=18, D=16, causal=True, layout="mixed", block_m=16, block_n=16, seed=30),
    Case("gapped_odd_head_dim", point=('layout', 'odd_head_dim'),
         why="NaN gaps right after each row's last head-dim column, and only whole key blocks: a head-dim mask "
             "admitting column D on the unmasked fast path reads the gap (0 * NaN in the dot); found by the "
             "mutation sweep",
         H=2, Nq=19, Nk=128, D=24, layout="gapped", seed=41),
    Case("causal_diagonal_at_block_edge", point=('causal', 'diagonal'),
         why="causal, Nk - Nq = 62: row 0's last visible key sits one before a block boundary (64), so an "
             "off-by-one in the end of the fully visible key blocks lets it see key 63; found by the sweep",
         Nq=40, Nk=102, D=16, causal=True, seed=42),
    Case("layout_mixed_many_keys", point=('layout', 'many_key_blocks'),
         why="q, k, v, out in different layouts with several key blocks at the kernel's own tiles: a pointer "
             "advanced by another tensor's row stride shows from the second block on",
         B=2, H=3, Nq=19, Nk=150, D=16, layout="mixed", seed=43),
    Case("batch_heads_d64", point=('partial_query_block', 'partial_key_block'), why="B = H = 2 at D = 64 (the common head dim) with partial blocks: in fp16/bf16 "
         "the tensor-core path, fp32 accumulation, output in the input dtype",
         B=2, H=2, Nq=37, Nk=45, D=64, seed=31),
    Case("causal_cross_d32", point=('causal', 'nq_lt_nk'), why="causal with Nq < Nk at D = 32", Nq=29, Nk=64, D=32, causal=True, seed=32),
    Case("causal_cross_nq_gt_nk_d32", point=('sees_no_key',), why="causal with Nq > Nk at D = 32: the first rows see no key",
         Nq=64, Nk=29, D=32, causal=True, seed=34),
    Case("fp32_precision",
         why="fp32 dots need input_precision='ieee'; tf32 keeps 10 mantissa bits (~1e-3 error) and must fail "
             "the fp32 tolerance (seed: tl.dot constraints). On the CPU the interpreter is always exact",
         Nq=64, Nk=64, D=128, dtype="fp32", seed=35),
    Case("nan_input_stays_in_its_row", why="a NaN in one query row must not spread to the other rows (a row max or a "
         "sum shared across rows lets it); that row's own output is not judged. The protocol admits finite "
         "inputs only, so a kernel is judged on it only when it declares --nan-stays-in-row (the project's do; a "
         "kernel scaling q per tensor or per block spreads the NaN and is right by the protocol)",
         Nq=20, Nk=24, D=16, data="nan_input", seed=36),
    Case("empty_queries", point=('empty_queries',), why="Nq = 0 is legal and gives an empty output", Nq=0, Nk=8, D=16, seed=37),
    Case("empty_queries_causal", point=('empty_queries', 'causal'),
         why="Nq = 0 under the causal mask is legal too: no row exists, so a bound taken from the rows (the first "
             "row's diagonal, a max or min over no rows) must not be needed",
         Nq=0, Nk=8, D=16, causal=True, seed=140),
    Case("long_sequence", point=('causal',), why="a realistic size: many programs and key blocks with the default tiles",
         B=2, H=4, Nq=1024, Nk=1024, D=64, causal=True, seed=38,
         gpu_only="size: the interpreter would take minutes"),
    Case("offsets_over_2_31", point=('offsets_past_2_31',),
         why="B*H*N*D > 2^31 elements: batch/head offsets computed in int32 wrap around and read another "
             "head (or fault); eight (b, h) pairs judged, the last included. (Exactly 2^31 elements is not "
             "enough: the largest offset is then 2^31 - 1, which int32 still holds)",
         B=1040, H=32, Nq=512, Nk=512, D=128, dtype="half", seed=40, sample_heads=8,
         gpu_only="size: 4 GiB per tensor, beyond the interpreter"),
    Case("long_cross_decode", point=('few_queries', 'nq_lt_nk'), why="decode-like: few queries, many keys, default tiles", B=2, H=4, Nq=3,
         Nk=4099, D=128, seed=39, gpu_only="size: the interpreter would take minutes", gpu_only_interpreted=True),
    Case("backward_sums_over_key_blocks", point=('hundreds_of_key_blocks',),
         why="the backward's dQ of each query is a sum over every key block (FlashAttention-2 adds each block's part "
             "to it): kept in the input dtype across blocks, it drifts by a rounding a block. With every term of "
             "one sign (data gradient_sums: no cancellation to hide in) and 65536 keys (512 blocks of 128), a bf16 "
             "dQ summed in bf16 was 13 % off where fp32 sums stay within 0.3 % (fp16 too, with 64-key blocks). The "
             "forward is an ordinary one over many keys",
         Nq=16, Nk=65536, D=16, data="gradient_sums", seed=81,
         gpu_only="size: the interpreter would take minutes", gpu_only_interpreted=True),
    Case("backward_sums_over_query_blocks", point=('hundreds_of_query_blocks',),
         why="the backward's dK and dV of each key are sums over every query block (FlashAttention-2 keeps them "
             "in registers across its loop over query blocks): kept in the input dtype, they drift by a rounding "
             "a block; every term of one sign (data gradient_sums), 65536 queries (512 blocks of 128)",
         Nq=65536, Nk=16, D=16, data="gradient_sums", seed=82,
         gpu_only="size: the interpreter would take minutes", gpu_only_interpreted=True),
    Case("split_kv_decode", point=('lengths',), why="decode (16 queries, 769 keys, B*H = 2): a split-KV kernel splits the keys, "
         "e.g. [0, 256) .. [768, 769): overlapping or dropped keys, or a wrongly weighted combine", H=2, Nq=16,
         Nk=769, D=32, seed=65),
    Case("split_kv_decode_causal", point=('lengths', 'causal'), why="split_kv_decode, causal: the last split's one key is seen by the last "
         "query only, so 15 rows have an empty split (lse -inf): its partial output must be 0, not 0/0",
         H=2, Nq=16, Nk=769, D=32, causal=True, seed=66),
    # Half precision in the layouts Hopper kernels read through tensor descriptors (TMA): 16-byte rows.
    Case("half_descriptor_layout", point=('batch_heads', 'nq_lt_nk', 'odd_head_dim'),
         why="fp16/bf16, B != H, Nq < Nk, D = 24 (48-byte rows, head dim padded to 32): what a kernel loading K/V "
             "through tensor descriptors (TMA) gets wrong: the descriptor's row count (Nq for Nk), its width (the "
             "padded head dim reads the next row) or the (batch, head) coordinates",
         B=2, H=3, Nq=20, Nk=53, D=24, dtype="half", seed=67),
    Case("half_descriptor_nq_gt_nk", point=('nq_gt_nk',),
         why="fp16/bf16 with Nq > Nk and 16-byte rows: a K/V descriptor sized by Nq reads past each head's keys "
             "(the last head's into memory it does not own)",
         H=2, Nq=48, Nk=20, D=32, dtype="half", seed=68),
    Case("block_override_decode_d128", point=('one_query',),
         why="decode at D = 128 with a pinned BLOCK_M of 64: a tile override must still launch, whatever pipeline "
             "depth the kernel's default tile was tuned with (on an H200 the fused kernel's 4-stage decode "
             "default asked 273 KB of shared memory at 64 x 128; found by a generated case)",
         H=2, Nq=1, Nk=300, D=128, dtype="half", block_m=64, seed=71),
    # ---- protocol v3's optional features (cases/features.py): each case runs where the kernel has the feature ----
    Case("gqa_groups_of_three", point=("batch_heads",),
         why="GQA, 6 query heads on 2 kv heads (groups of 3), B = 2 != H: a head map right only for some group sizes "
             "(h % Hkv for h // (H // Hkv), or the group counted as Hkv // H) reads the wrong kv head",
         B=2, H=6, Hkv=2, Nq=19, Nk=37, D=16, seed=80),
    Case("gqa_groups_of_four_causal", point=("sees_no_key",),
         why="GQA, 8 query heads on 2 kv heads, causal with Nq > Nk (the first rows see no key), B = 3: the kv head "
             "map composed with the batch and the causal mask",
         B=3, H=8, Hkv=2, Nq=40, Nk=29, D=32, causal=True, seed=81),
    Case("mqa_decode", point=("few_queries", "many_key_blocks"),
         why="MQA (one kv head for 4 query heads), decode: 3 queries against 300 keys (a split-KV kernel splits "
             "them): every query head must read the one kv head, in every split",
         B=2, H=4, Hkv=1, Nq=3, Nk=300, D=64, seed=82),
    Case("dv_smaller", point=("partial_key_block", "dv_lt_d"),
         why="a value head dim of its own, Dv = 16 < D = 64: V, the accumulator and the output sized or masked with D "
             "read past V's rows and write past the output's",
         H=2, Nq=20, Nk=45, D=64, Dv=16, seed=83),
    Case("dv_larger_odd_causal", point=("causal", "dv_gt_d", "odd_dv"),
         why="Dv = 40 > D = 16, not a power of two, causal: V's padded columns masked with D's mask drop columns 16..39",
         B=2, H=3, Nq=37, Nk=23, D=16, Dv=40, causal=True, seed=84),
    Case("dv_half_descriptor", point=("batch_heads", "dv_gt_d"),
         why="fp16/bf16 with 16-byte rows, D = 16 < Dv = 32: a V tensor descriptor (TMA) shaped or boxed by D "
             "zero-fills V's columns 16..31",
         B=2, H=3, Nq=20, Nk=53, D=16, Dv=32, dtype="half", seed=85),
    Case("dv_split_decode", point=("lengths", "dv_ne_d"),
         why="decode (16 queries, 769 keys) with Dv = 48 != D = 32: the split-KV partial outputs and their combine "
             "strided by D",
         H=2, Nq=16, Nk=769, D=32, Dv=48, seed=86),
    Case("window_hand_4x4", point=("lengths",),
         why="window (1, 0) on 4 queries and 4 keys that all score alike: row i sees keys i - 1 and i, so the output "
             "is exactly 1, 1.5, 3, 6 for values 1, 2, 4, 8 (the mask written out by hand)",
         Nq=4, Nk=4, D=1, data="explicit", q=((1.0,),) * 4, k=((1.0,),) * 4, v=((1.0,), (2.0,), (4.0,), (8.0,)),
         expected=((1.0,), (1.5,), (3.0,), (6.0,)), exact=True, window=(1, 0)),
    Case("window_hand_bottom_right", point=("lengths",),
         why="window (1, 0) with Nq = 2 < Nk = 4: bottom-right aligned, row 0 sees keys 1, 2 and row 1 keys 2, 3: "
             "exactly 3 and 6 (a top-left window gives 1 and 1.5)",
         Nq=2, Nk=4, D=1, data="explicit", q=((1.0,),) * 2, k=((1.0,),) * 4, v=((1.0,), (2.0,), (4.0,), (8.0,)),
         expected=((3.0,), (6.0,)), exact=True, window=(1, 0)),
    Case("window_diagonal_only", point=(),
         why="window (0, 0): each row sees its diagonal key alone, so the output is that key's value row; an edge "
             "off by one adds a neighbour",
         H=2, Nq=33, Nk=33, D=16, window=(0, 0), seed=87),
    Case("window_keys_from_the_diagonal", point=("nq_lt_nk",),
         why="window (0, None): each row sees keys from its diagonal to the last (the mirror of causal), Nq < Nk",
         Nq=20, Nk=53, D=16, window=(0, None), seed=88),
    Case("window_right_zero_is_causal", point=("nq_gt_nk",),
         why="window (None, 0) is causal through window=: rows that see no key give 0, never NaN",
         Nq=48, Nk=20, D=16, window=(None, 0), seed=89),
    Case("window_crossing_key_blocks", point=("nq_ne_nk", "several_key_blocks"),
         why="window (20, 10) with Nq = 40 < Nk = 100 and 16-key blocks: both edges cross block boundaries; blocks "
             "outside every row's window may be skipped, a partly visible one must still be masked at both edges",
         Nq=40, Nk=100, D=16, window=(20, 10), block_m=16, block_n=16, seed=90),
    Case("window_rows_see_nothing", point=("lengths",),
         why="window (3, 2) with Nq = 48 > Nk = 20: the first 26 rows see no key at all (0, lse -inf, never NaN)",
         Nq=48, Nk=20, D=16, window=(3, 2), seed=91),
    Case("window_wider_than_the_sequence", point=(),
         why="window (200, 300) on 50 keys: every row sees every key; a window clipped wrongly at the ends drops keys",
         Nq=50, Nk=50, D=16, window=(200, 300), seed=92),
    Case("window_with_causal", point=("nq_lt_nk",),
         why="window (8, 5) with causal=True: causal sets the right side to 0 (bottom-right), whatever window says",
         Nq=30, Nk=61, D=32, causal=True, window=(8, 5), seed=93),
    Case("window_left_edge_on_a_block_end", point=("lengths",),
         why="window (72, 0) with Nq = 4, Nk = 203: row 0's first key is 127, the last key of a block of 16, 32, 64 "
             "or 128, and each later row starts one key on: a first block found from the first key plus one, or a "
             "block skipped when its last key is the only one a row sees, drops that key",
         Nq=4, Nk=203, D=16, window=(72, 0), seed=141),
    Case("window_decode", point=("one_query",),
         why="one query (a decode step), causal, window (50, 0) over 203 keys: a single-query path of its own (a "
             "split-KV decode kernel the general one dispatches to) must apply the window's left side too; 152 of "
             "the keys lie left of it",
         H=2, Nq=1, Nk=203, D=32, causal=True, window=(50, 0), seed=142),
    Case("window_very_negative_scores", point=("several_key_blocks",),
         why="window (5, 0) over 100 keys, every scaled score far below exp's underflow (about -150 in half "
             "precision): a key block a kernel visits that is wholly masked for some of its rows must leave their "
             "running max at -inf; a max kept as 0 there (the guard against -inf - -inf stored as the state) outranks "
             "every later score, each weight exp(s - 0) underflows to 0, and the row is 0 / 0 (vLLM's unified "
             "attention, found-bugs.md row 20)",
         Nq=40, Nk=100, D=16, causal=True, window=(5, 0), data="very_negative", seed=146),
    Case("softcap_tanh_region", point=("several_key_blocks",),
         why="softcap 1 on scores of about +-1e4 (scaled: hundreds, far past 88 c): c tanh(s / c) saturates; tanh "
             "written as (e^2x - 1) / (e^2x + 1) gives inf / inf = NaN, (s / c) tanh(s / c) is no cap",
         Nq=20, Nk=70, D=32, data="large", magnitude=1e4, softcap=1.0, seed=94),
    Case("softcap_negative_scale", point=("scale",),
         why="softcap 2 with a negative scale: the cap is odd in s, and nothing may assume s > 0",
         Nq=24, Nk=30, D=32, scale=-0.7, softcap=2.0, seed=95),
    Case("softcap_before_the_masks", point=("sees_no_key",),
         why="softcap 5, causal with Nq > Nk: the cap comes before the masks; capped after them, a masked key's -inf "
             "becomes -5 and takes weight, and rows that see no key get NaN",
         Nq=40, Nk=25, D=16, causal=True, softcap=5.0, seed=96),
    Case("alibi_heads_causal", point=("causal",),
         why="ALiBi slopes per head, causal: the bias -slope |i + Nk - Nq - j| (its sign, its absolute value, its "
             "bottom-right distance)",
         H=4, Nq=40, Nk=40, D=16, causal=True, alibi="heads", seed=97),
    Case("alibi_batch_heads_cross", point=("nq_lt_nk", "batch_heads"),
         why="ALiBi slopes per (batch, head), not causal, Nq < Nk: the distance counts from the bottom-right "
             "diagonal both ways, and each batch has its own slopes",
         B=2, H=3, Nq=20, Nk=53, D=16, alibi="batch_heads", seed=98),
    Case("every_feature_at_once", point=("nq_lt_nk", "features_together"),
         why="GQA (6 on 3), Dv = 48 != D = 32, window (10, 5), softcap 5 and ALiBi together: each feature's "
             "effect composed with the others' (a kernel that lacks some is judged on the rest, while two remain)",
         B=2, H=6, Hkv=3, Nq=30, Nk=70, D=32, Dv=48, window=(10, 5), softcap=5.0, alibi="heads", seed=99),
    Case("decode_every_feature", point=("one_query", "features_together"),
         why="one query against 203 keys with GQA (4 on 2), Dv = 48 > D = 32, window (60, 0), softcap 5 and ALiBi: "
             "a decode path of its own must carry every feature the general path does (an independent tester's "
             "kernels forgot each there in turn, the left window and value columns past D among them, which no "
             "other entry met with one query)",
         B=2, H=4, Hkv=2, Nq=1, Nk=203, D=32, Dv=48, causal=True, window=(60, 0), softcap=5.0, alibi="heads",
         seed=143),
    Case("alibi_batch_heads_decode", point=("one_query", "batch_heads"),
         why="one query per sequence against 70 keys, ALiBi slopes per (batch, head): a decode path of its own "
             "must read each batch's own slopes (one that reads batch 0's row for every batch passed every other "
             "entry)",
         B=3, H=2, Nq=1, Nk=70, D=16, alibi="batch_heads", seed=147),
    Case("half_unaligned_rows", point=('layout',),
         why="fp16/bf16 rows of D + 3 elements (38 bytes): tensor descriptors need 16-byte strides, so a TMA kernel "
             "must take another path here (or refuse), never fail or read misaligned rows",
         B=2, H=3, Nq=19, Nk=23, D=16, layout="gapped", dtype="half", seed=69),
]

# ---- packed sequences and paged KV caches (cases/protocols.py): judged only on a varlen or paged kernel, each
# sequence by the dense oracle among the others; a paged kernel takes the cases whose sequences share Nq ----
_EVERY_FIFTH = tuple((0, 0) if i % 5 == 0 else (i + 2, 3 * i % 11 + 1) for i in range(16))
PACKED = [
    Case("varlen_empty_sequences",
         why="zero-length sequences at the start, in the middle (no queries, no keys, both) and at the end: stores "
             "bounded by the padded total write into the next sequence, and a program of an empty sequence must "
             "still leave the others alone",
         H=2, D=16, seqlens=((0, 5), (7, 9), (0, 0), (6, 0), (13, 11), (0, 4)), seed=120),
    Case("varlen_empty_sequences_causal",
         why="the same, causal: the bottom-right diagonal of each sequence (Nk_b - Nq_b), and rows of a sequence "
             "with no keys give 0 (lse -inf), never NaN and never the next sequence's keys",
         H=2, D=16, causal=True, seqlens=((0, 5), (7, 9), (0, 0), (6, 0), (13, 11), (0, 4)), seed=121),
    Case("varlen_every_fifth_empty",
         why="16 sequences, every fifth empty, the others short and of unrelated lengths: per-sequence offsets "
             "read from cu_seqlens, never computed from the program id and a padded length",
         H=3, D=16, causal=True, seqlens=_EVERY_FIFTH, seed=122),
    Case("varlen_one_row",
         why="sequences of one query (decode-like) against 1, 17 and no keys, causal: the last query row of each "
             "sequence sees all of its keys",
         H=2, D=32, causal=True, seqlens=((1, 1), (1, 17), (1, 0), (1, 1)), seed=123),
    Case("varlen_block_edges",
         why="lengths one below, at and one above the block edges (16, 64, 128): a key tile that crosses into the "
             "next sequence must be masked by this sequence's key count, not the packed total",
         H=2, D=16, seqlens=((15, 17), (16, 16), (17, 15), (63, 65), (64, 64), (65, 129), (128, 127)), seed=124),
    Case("varlen_block_edges_causal",
         why="the same edges, causal: the causal block past the diagonal still masks by the key count, or it reads "
             "the next sequence's keys",
         H=2, D=16, causal=True, seqlens=((127, 128), (129, 128), (65, 64), (64, 65), (17, 16)), seed=125),
    Case("varlen_cross_causal",
         why="Nq != Nk inside each sequence, both ways, causal: the diagonal offset is per sequence (Nk_b - Nq_b), "
             "not the offset of the longest sequences or of the packed totals",
         H=2, D=16, causal=True, seqlens=((3, 20), (20, 3), (17, 40), (40, 17)), seed=126),
    Case("varlen_long_beside_short",
         why="one long sequence among many short ones: a kernel that sizes its grid or its lse scratch from one "
             "sequence, or rounds each to its block size, overwrites its neighbours",
         H=2, D=16, seqlens=((300, 300), (1, 1), (2, 3), (3, 2), (1, 1), (5, 8)), seed=127),
    Case("varlen_max_seqlen_larger",
         why="max_seqlen_q and max_seqlen_k given 37 larger than the longest sequence (legal: they are bounds): a "
             "kernel that takes them as the lengths reads past every sequence",
         H=2, D=16, causal=True, seqlens=((10, 12), (31, 29), (4, 9)), max_seqlen_extra=37, seed=128),
    Case("varlen_max_seqlen_omitted",
         why="max_seqlen_q and max_seqlen_k not passed (the protocol's default, None), the first sequence the "
             "shortest: a kernel must find the longest sequence in the offsets, not take the first one's length, "
             "the packed total's or a default tile as the bound of its grid",
         H=2, D=16, causal=True, seqlens=((3, 5), (40, 33), (0, 2), (70, 90), (17, 17)), max_seqlen_extra=None,
         seed=135),
    Case("varlen_gqa_window_softcap",
         why="GQA (6 on 2), a sliding window (8, 0) and softcap 5 in packed sequences of different lengths: the "
             "features' offsets count inside each sequence",
         H=6, Hkv=2, D=16, window=(8, 0), softcap=5.0, seqlens=((9, 30), (30, 9), (0, 7), (17, 17)), seed=129),
    Case("varlen_alibi_batch_heads_softcap",
         why="ALiBi slopes per (sequence, head) with softcap 5 in packed sequences of different lengths: each "
             "sequence reads its own row of the (B, H) slopes and its own bottom-right distances, the cap before the "
             "bias (no packed entry had ALiBi: a kernel that took row 0 for every sequence passed them all)",
         H=3, D=16, alibi="batch_heads", softcap=5.0, seqlens=((20, 53), (7, 7), (0, 5), (13, 30)), seed=131),
    Case("paged_page_size_1",
         why="a paged cache of one-slot pages (every key its own page, the pages shuffled in a pool three times "
             "larger, unused pages NaN): the block-table lookup for every key",
         H=2, D=16, causal=True, seqlens=((4, 9), (4, 0), (4, 33)), page_size=1, seed=130),
    Case("paged_decode_page_16",
         why="decode (one query) over pages of 16 with cache lengths 15, 16, 17 and 100: the last page partly "
             "filled, its unused slots NaN, and the block-table entry past the last page points at a NaN page",
         H=4, Hkv=2, D=32, causal=True, seqlens=((1, 15), (1, 16), (1, 17), (1, 100)), page_size=16, seed=131),
    Case("paged_page_128",
         why="pages of 128 with lengths 127, 129 and 300 (a page crossed mid-tile, lengths past two pages)",
         H=2, D=16, causal=True, seqlens=((2, 127), (2, 129), (2, 300)), page_size=128, seed=132),
    Case("paged_odd_page_size",
         why="pages of 7 slots, not a power of two and not a multiple of any tile: every tile crosses a page "
             "boundary, so a kernel that maps a whole tile through one table entry reads the wrong page",
         H=2, D=16, causal=True, seqlens=((3, 20), (3, 7), (3, 1), (3, 50)), page_size=7, seed=133),
    Case("paged_gqa_small_pages",
         why="GQA (6 query heads on 2 kv heads) through pages of 3 slots: each query head must read its group's kv "
             "head in every page (a kernel that maps heads otherwise for pages smaller than its tile passed every "
             "paged entry, none of which had Hkv < H beside MQA, where every map agrees)",
         H=6, Hkv=2, D=16, causal=True, seqlens=((3, 20), (3, 9), (3, 1), (3, 33)), page_size=3, seed=136),
    Case("paged_window",
         why="a sliding window (7, 2) over paged caches of different lengths: the window's offset is each sequence's "
             "own Nk - Nq, not the longest cache's (no paged entry had a window, and the dense window entries "
             "replay as sequences of equal lengths)",
         H=2, D=16, window=(7, 2), seqlens=((4, 30), (4, 11), (4, 5), (4, 19)), page_size=5, seed=137),
    Case("paged_alibi_batch_heads_softcap",
         why="ALiBi slopes per (sequence, head) with softcap 5 over paged caches of different lengths: each "
             "sequence's own slopes row and its own Nk - Nq for the distances",
         H=3, D=16, alibi="batch_heads", softcap=5.0, seqlens=((4, 30), (4, 11), (4, 5), (4, 19)), page_size=5,
         seed=139),
    Case("paged_at_capacity",
         why="cache lengths that fill their last page to its last slot (32 and 48 keys in pages of 16): the bound "
             "of the last page is its size, not one less",
         H=2, D=16, seqlens=((2, 32), (2, 48)), page_size=16, seed=134),
]
PACKED_NAMES = frozenset(c.name for c in PACKED)

BY_NAME = {c.name: c for c in CATALOGUE + PACKED}
assert len(BY_NAME) == len(CATALOGUE) + len(PACKED), "catalogue names must be unique"
for _entry in CATALOGUE:
    check_points(_entry)


def instances(dtypes=None, cases=None):
    """Every concrete case of the catalogue (or of `cases`), in catalogue order, each entry expanded into
    the dtypes it is about that `dtypes` admits (default: all): partial_last_key_block[fp32], [fp16], ..."""
    return [i for c in (CATALOGUE if cases is None else cases) for i in c.instances(dtypes)]


def primary(case):
    """The instance of an entry the bug corpus judges: the first dtype it is about (fp32 when it is about
    every dtype: the tightest tolerance)."""
    return case.instances()[0]


def judgeable(backend, cases=None):
    """The primary instance of each entry (or of `cases`) that `backend` can judge for the project's own Triton
    kernels: GPU-only entries and bf16 (Triton's interpreter reads it wrongly) need the GPU. What the bug corpus
    runs its mutants on."""
    out = []
    for c in (CATALOGUE if cases is None else cases):
        inst = primary(c)
        if backend == "gpu" or not (inst.gpu_only or inst.dtype == "bf16"):
            out.append(inst)
    return out


def get(name):
    """A catalogue case by name: an entry's name gives its primary instance, name[dtype] that instance."""
    base, _, dtype = name.partition("[")
    try:
        entry = BY_NAME[base]
    except KeyError:
        raise KeyError(f"no catalogue case named {name!r}") from None
    if not dtype:
        return primary(entry)
    for inst in entry.instances():
        if inst.name == name:
            return inst
    raise KeyError(f"catalogue case {base!r} has no instance {name!r} (it is about {', '.join(entry.dtypes)})")
