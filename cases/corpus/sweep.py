"""The automatic mutation sweep: mechanical mutants of kernel/fused.py, judged by the whole catalogue.

The hand-written corpus (cases/corpus/mutants.py) holds the bugs someone has seen; the sweep asks what else the
catalogue would miss. It mutates the bodies of the kernel's @triton.jit functions only (not docstrings,
comments or the host code), one change per mutant:

    comparison boundary   <  <-> <=,  >  <-> >=,  == <-> !=
    boolean combination   &  <-> |
    arithmetic sign       +  <-> -  (binary), += <-> -=
    broadcast axis        [:, None] <-> [None, :]
    masked-load fill      other=0.0 -> other=float("-inf") | other=1.0
    min / max             tl.minimum <-> tl.maximum, tl.min <-> tl.max
    constants             every numeric literal +1 and -1
    statement dropped     an assignment or call statement replaced by `pass`

Each mutant is judged in a worker subprocess (cases/corpus/mutants.py isolation: a mutant that corrupts memory
takes only its own process down) on the catalogue, stopping at the first kill. A survivor is either
EQUIVALENT (it computes the same results on every legal input; the table below gives the reason for
each, keyed by a stable id: the operator, the text of the line and the occurrence) or a GAP of the
catalogue, reported with its diff. An equivalent whose line changes gets a new id and shows up as a gap
again until someone re-reads it: that is intended.
"""
import ast
import io
import sys
import time
import tokenize
from dataclasses import dataclass

from flashcheck.cases import catalogue
from flashcheck.cases.backend import backend, describe
from flashcheck.cases.corpus import mutants
from flashcheck.cases.corpus.mutants import MODULES, Mutant, diff
from flashcheck.cases.report import publish

# Cases first that kill many mutants quickly, so that the stop-at-first-kill search is short.
FIRST = ("partial_last_key_block", "causal_nq_gt_nk", "partial_last_query_block", "cross_nq_lt_nk",
         "batch_heads_mixed_causal", "many_key_chunks_growing_max", "head_dim_17", "causal_default_blocks")

# id -> why the mutant cannot change any result (reviewed by hand; see the module docstring).
# K and V load through one helper (_load_kv), so a mechanical mutant of a load changes both.
_KV_FILL = ("the masked lanes are padded head-dim columns (K's meet Q's zero padding in the dot; V's only reach "
            "output columns past D, which the store never writes) or key rows past Nk (K's scores are replaced "
            "by the -inf score mask; V's rows are multiplied by p = exp2(-inf) = 0 exactly): any finite fill "
            "gives the same output")
# The unmasked fast path masks only padded head-dim columns (when BLOCK_D > D, or in the second half of a split
# head dim).
_KV_PAD = ("the masked lanes on the fast path are padded head-dim columns: K's meet Q's zero padding in the dot, "
           "V's only reach output columns past D, which the store never writes: any finite fill gives the same "
           "output")
_Q_FILL = ("Q's masked lanes are rows past Nq, whose output the store masks off, or padded head-dim "
           "columns, which meet K's zero fill in the dot: any finite fill gives the same output")
_NO_KEY_SHIFT = ("the shift only applies to rows that have seen no key yet (m_new = -inf, every score -inf): "
                 "exp2(-inf - x) = 0 for any finite x, so p = 0 and c = 0 whatever the shift")
_FULL_HI_LOWER = ("full_hi only decides which key blocks may skip the masks (and caps full_lo, where a window's "
                  "left-edge blocks end); a lower bound sends more blocks through the masked paths, which are exact "
                  "for every block, and the three ranges still cover the program's keys (slower, same results)")
_TRUNC = ("Triton's integer // truncates toward zero, so a bound of -1 (or 1) instead of 0 still gives "
          "0 // BLOCK_N * BLOCK_N = 0 for every BLOCK_N > 1: the same loop bounds")
_EXTRA_BLOCK = ("a program none of whose rows sees any key visits one fully masked block: its scores are "
                "-inf, p = 0, and V holds finite values there, so nothing changes (wasted work only)")
EQUIVALENT = {
    "other=0.0 -> other=1.0 | x = tl.load(ptrs, mask=kv_mask, other=0.0) | #1": _KV_FILL,
    "const 0.0 -> -1.0 | x = tl.load(ptrs, mask=kv_mask, other=0.0) | #1": _KV_FILL,
    "other=0.0 -> other=1.0 | x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0) | #1": _KV_PAD,
    "const 0.0 -> -1.0 | x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0) | #1": _KV_PAD,
    "'<=' -> '<' | elif COL + BLOCK_D <= HEAD_DIM: | #1":
        "a block whose columns end exactly at D takes the masked load with a mask that is true everywhere: the "
        "same values (slower only)",
    'drop statement | tl.static_assert(not (SPLIT and D_SPLIT), "split-KV and a split head dim are not combined") '
    "| #1": "a compile-time check only: the host never launches SPLIT with D_SPLIT, so nothing it guards runs",
    "other=0.0 -> other=1.0 | q = tl.load(q, mask=q_mask, other=0.0) | #1": _Q_FILL,
    "const 0.0 -> -1.0 | q = tl.load(q, mask=q_mask, other=0.0) | #1": _Q_FILL,
    "other=0.0 -> other=1.0 | q1 = tl.load(q1, mask=mask1, other=0.0) | #1": _Q_FILL,
    "const 0.0 -> -1.0 | q1 = tl.load(q1, mask=mask1, other=0.0) | #1": _Q_FILL,
    "drop statement | m_block = m_blocks - 1 - m_block | #1":
        "the causal heaviest-first order only changes which program computes a query block when, not what it "
        "computes: without it, block i is still computed once, by program i",
    'const 0.0 -> -1.0 | m_shift = tl.where(m_new == float("-inf"), 0.0, m_new) | #1': _NO_KEY_SHIFT,
    'const 0.0 -> 1.0 | m_shift = tl.where(m_new == float("-inf"), 0.0, m_new) | #1': _NO_KEY_SHIFT,
    "'<' -> '<=' | q_mask = (offs_m[:, None] < Nq) & (offs_d[None, :] < HEAD_DIM) | #1":
        "not visible in any result: Q's row Nq is read (one row past Q) but only feeds output row Nq, which "
        "the store masks off. It is still a stray read that can fault at the end of an allocation: only a "
        "memory checker sees it (flashcheck sanitize, compute-sanitizer on the GPU)",
    "minimum -> maximum | hi = tl.minimum(tl.maximum(start_m + BLOCK_M + right_shift, 0), Nk) | #1":
        "hi only bounds the causal (or windowed) key loop: past Nk every block is fully masked (K/V load 0, "
        "scores -inf, p = 0) and adds nothing (wasted work only)",
    "const 0 -> -1 | hi = tl.minimum(tl.maximum(start_m + BLOCK_M + right_shift, 0), Nk) | #1":
        "only programs none of whose rows sees a key reach the floor: hi = -1 and hi = 0 both leave the loop "
        "empty (full_hi = 0)",
    "const 0 -> 1 | hi = tl.minimum(tl.maximum(start_m + BLOCK_M + right_shift, 0), Nk) | #1": _EXTRA_BLOCK,
    "'+' -> '-' | full_hi = tl.minimum(tl.maximum(start_m + right_shift + 1, 0), hi) // BLOCK_N * BLOCK_N "
    "| #2": _FULL_HI_LOWER,
    "const 1 -> 0 | full_hi = tl.minimum(tl.maximum(start_m + right_shift + 1, 0), hi) // BLOCK_N * BLOCK_N "
    "| #1": _FULL_HI_LOWER,
    "const 0 -> -1 | full_hi = tl.minimum(tl.maximum(start_m + right_shift + 1, 0), hi) // BLOCK_N * BLOCK_N "
    "| #1": _TRUNC,
    "const 0 -> 1 | full_hi = tl.minimum(tl.maximum(start_m + right_shift + 1, 0), hi) // BLOCK_N * BLOCK_N "
    "| #1": _TRUNC,
    "const 1.0 -> 2.0 | l_safe = tl.where(l_i == 0.0, 1.0, l_i) | #1":
        "l = 0 only in rows that saw no key, whose accumulator is 0: 0 / 2 = 0 / 1 = 0, and the lse takes "
        "its other branch there",
    'const 0.0 -> -1.0 | lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) '
    '* 0.6931471805599453) | #1':
        "l = 0 exactly when the row saw no key, and then m = -inf makes the other branch -inf as well",
}


@dataclass(frozen=True)
class Generated:
    id: str          # stable: "operator | line text | occurrence"
    op: str
    line: int        # 1-based line of the change in the current source
    mutant: Mutant


def _jit_ranges(tree):
    """(first, last) line of each @triton.jit function body, docstring excluded."""
    ranges = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        if not any(ast.unparse(d).endswith("jit") for d in node.decorator_list):
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:]
        if body:
            ranges.append((body[0].lineno, node.end_lineno, body))
    return ranges


_SWAP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "&": "|", "|": "&",
         "+=": "-=", "-=": "+="}
_BINARY_LEFT = {tokenize.NAME, tokenize.NUMBER}
_NAMES = {"minimum": "maximum", "maximum": "minimum", "min": "max", "max": "min"}
_OTHER_VALUES = ('float("-inf")', "1.0")


def _number_variants(text):
    try:
        value = int(text)
        return [str(value + 1), str(value - 1)]
    except ValueError:
        value = float(text)
        return [repr(value + 1.0), repr(value - 1.0)]


def _candidates(text, tokens, ranges):
    """(start offset, end offset, new text, operator label) of every single-point mutation."""
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))

    def off(pos):
        return starts[pos[0] - 1] + pos[1]

    def inside(tok):
        return any(a <= tok.start[0] <= b for a, b, _ in ranges)

    code = [t for t in tokens if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                                                tokenize.DEDENT, tokenize.ENDMARKER)]
    out = []
    for i, tok in enumerate(code):
        if not inside(tok):
            continue
        prev = code[i - 1] if i else None
        s = tok.string
        if tok.type == tokenize.OP:
            if s in _SWAP:
                out.append((off(tok.start), off(tok.end), _SWAP[s], f"{s!r} -> {_SWAP[s]!r}"))
            elif s in "+-" and prev is not None and (prev.type in _BINARY_LEFT or prev.string in ")]"):
                new = "-" if s == "+" else "+"
                out.append((off(tok.start), off(tok.end), new, f"{s!r} -> {new!r}"))
            elif s == "[" and i + 4 < len(code):
                window = "".join(t.string for t in code[i:i + 5])
                flipped = {"[:,None]": "[None, :]", "[None,:]": "[:, None]"}.get(window)
                if flipped:
                    out.append((off(tok.start), off(code[i + 4].end), flipped,
                                f"{window.replace(',', ', ')!r} -> {flipped!r}"))
        elif tok.type == tokenize.NAME:
            if s in _NAMES and prev is not None and prev.string == ".":
                out.append((off(tok.start), off(tok.end), _NAMES[s], f"{s} -> {_NAMES[s]}"))
            elif s == "other" and code[i + 1].string == "=":
                j, depth = i + 2, 0
                while depth or code[j].string not in (",", ")"):
                    depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(code[j].string, 0)
                    j += 1
                a, b = off(code[i + 2].start), off(code[j - 1].end)
                for value in _OTHER_VALUES:
                    if value != text[a:b]:
                        out.append((a, b, value, f"other={text[a:b]} -> other={value}"))
        elif tok.type == tokenize.NUMBER:
            for new in _number_variants(s):
                out.append((off(tok.start), off(tok.end), new, f"const {s} -> {new}"))
    for _, _, body in ranges:
        for node in ast.walk(ast.Module(body=body, type_ignores=[])):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr)):
                a = starts[node.lineno - 1] + node.col_offset
                b = starts[node.end_lineno - 1] + node.end_col_offset
                out.append((a, b, "pass", "drop statement"))
    return out


def _unique_context(text, a, b):
    """(start, end) of the smallest run of whole lines around [a, b) that occurs exactly once in text."""
    start = text.rfind("\n", 0, a) + 1
    end = text.find("\n", b)
    end = len(text) if end < 0 else end + 1
    grow_up = True
    while text.count(text[start:end]) != 1:
        if grow_up and start > 0:
            start = text.rfind("\n", 0, start - 1) + 1
        elif end < len(text):
            nxt = text.find("\n", end)
            end = len(text) if nxt < 0 else nxt + 1
        grow_up = not grow_up
    return start, end


def generate(module="fused"):
    """The sweep's mutants of kernel/<module>.py, in source order."""
    text = MODULES[module].read_text()
    tree = ast.parse(text)
    ranges = _jit_ranges(tree)
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    seen_text, seen_id, out = set(), {}, []
    # in source order; where two operators make the same text, the more specific one (other=) names it
    ordered = sorted(_candidates(text, tokens, ranges), key=lambda c: (c[0], not c[3].startswith("other="), c[3]))
    for a, b, new, op in ordered:
        mutated = text[:a] + new + text[b:]
        if mutated in seen_text or mutated == text:
            continue
        seen_text.add(mutated)
        ast.parse(mutated)   # every operator above keeps the source valid Python
        line = text.count("\n", 0, a) + 1
        line_text = text.splitlines()[line - 1].split("#")[0].strip()
        key = (op, line_text)
        seen_id[key] = seen_id.get(key, 0) + 1
        ident = f"{op} | {line_text} | #{seen_id[key]}"
        s, e = _unique_context(text, a, b)
        name = f"sweep_{len(out) + 1:03d}"
        mutant = Mutant(name, module, text[s:e], text[s:a] + new + text[b:e],
                        breaks=f"{op} at line {line}", origin="sweep", killers=())
        out.append(Generated(ident, op, line, mutant))
    return out


def sweep_diff(g):
    return diff(g.mutant)


def _progress(text):
    print(text, file=sys.stderr, flush=True)


def run(args):
    """flashcheck mutants --sweep: judge every generated mutant, print the score and the survivors."""
    be = backend()
    generated = generate()
    if args.limit is not None:
        generated = generated[:args.limit]
    judgeable = catalogue.judgeable(be)
    extra = args.extra_cases
    first = [c for name in FIRST for c in judgeable if c.name.partition("[")[0] == name]
    cases = first + [c for c in judgeable if c not in first] + extra
    _progress(f"flashcheck mutants --sweep: {len(generated)} mutants of kernel/fused.py x up to {len(cases)} "
              f"cases ({len(extra)} extra) on {describe()}, {args.jobs} job(s)")
    t0 = time.perf_counter()
    count = [0]

    def on_done(i, mutant, results):
        count[0] += 1
        g = generated[i]
        last_case, last = results[-1]
        state = f"killed by {last_case.name} ({last.kind})" if last.failed else "SURVIVED"
        _progress(f"[{count[0]:>3}/{len(generated)}] {mutant.name} {state:<48} {g.op} @ line {g.line}  "
                  f"({time.perf_counter() - t0:.0f} s)")

    outcomes = mutants.judge_isolated([(g.mutant, cases) for g in generated], jobs=args.jobs,
                                      stop_at_first=True, timeout=args.timeout, on_done=on_done)
    report = _report(be, describe(), generated, outcomes, time.perf_counter() - t0, [c.source() for c in extra])
    publish(_render(report), report, args.json)
    return 0 if not report["gaps"] else 1


def _report(be, where, generated, outcomes, seconds, extra):
    rows = []
    for g, results in zip(generated, outcomes):
        killer = next(((c.name, v.kind, v.failures[0].line()) for c, v in results if v.failed), None)
        rows.append({"name": g.mutant.name, "id": g.id, "op": g.op, "line": g.line,
                     "killed_by": killer and killer[0], "kind": killer and killer[1],
                     "failure": killer and killer[2],
                     "equivalent": EQUIVALENT.get(g.id) if killer is None else None,
                     "diff": sweep_diff(g)})
    killed = [r for r in rows if r["killed_by"]]
    equivalent = [r for r in rows if r["equivalent"]]
    gaps = [r for r in rows if not r["killed_by"] and not r["equivalent"]]
    trivial = [r for r in killed if r["kind"] in ("compile error", "exception")]
    stale = sorted(set(EQUIVALENT) - {r["id"] for r in rows})
    total = len(rows)
    return {"backend": be, "where": where, "seconds": round(seconds, 1), "extra_cases": extra,
            "total": total, "killed": len(killed), "trivially_killed": len(trivial),
            "equivalent": len(equivalent), "gaps": [r["name"] for r in gaps],
            "score": len(killed) / total if total else 1.0,
            "score_without_equivalents": len(killed) / (total - len(equivalent)) if total > len(equivalent) else 1.0,
            "stale_equivalents": stale, "mutants": rows}


def _render(report):
    out = [f"Mutation sweep of kernel/fused.py on {report['where']} ({report['seconds']:.0f} s)"]
    if report["extra_cases"]:
        out.append("with extra cases: " + "; ".join(report["extra_cases"]))
    out.append(f"{report['total']} mutants: {report['killed']} killed ({report['trivially_killed']} of them by a "
               f"compile error or exception), {report['equivalent']} equivalent, {len(report['gaps'])} gap(s)")
    out.append(f"mutation score {report['score']:.1%} (killed / all); "
               f"{report['score_without_equivalents']:.1%} excluding equivalent mutants")
    kinds = {}
    for r in report["mutants"]:
        if r["kind"]:
            kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    out.append("kills by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda x: -x[1])))
    for r in report["mutants"]:
        if r["killed_by"]:
            continue
        label = f"EQUIVALENT: {r['equivalent']}" if r["equivalent"] else "GAP: no catalogue case kills it"
        out += ["", f"survivor {r['name']}  [{r['id']}]", f"  {label}", r["diff"].rstrip()]
    if report["stale_equivalents"]:
        out += ["", "equivalence table entries that match no generated mutant (the kernel changed; re-review):"]
        out += [f"  {k}" for k in report["stale_equivalents"]]
    return "\n".join(out)
