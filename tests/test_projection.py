"""cases/projection.py on its own: the nearest admissible case that keeps an entry's point."""
from flashcheck.cases import catalogue
from flashcheck.cases.declarations import Declarations
from flashcheck.cases.projection import project


def _outside(decl):
    """admissible() as verify builds it, for the length declarations only."""
    def admissible(c):
        why = []
        if decl.same_length and c.Nq != c.Nk:
            why.append("same length")
        if c.Nq % decl.seq_multiple or c.Nk % decl.seq_multiple:
            why.append("multiple")
        if not decl.head_dim_ok(c.D):
            why.append("head dim")
        return why
    return admissible


def test_points_that_cannot_survive_say_so():
    decl = Declarations.make(same_length=True)
    case, why = project(catalogue.get("cross_nq_lt_nk"), decl, _outside(decl))
    assert case is None and "Nq < Nk" in why
    decl = Declarations.make(seq_multiple=128)
    case, why = project(catalogue.get("cross_nq_lt_nk"), decl, _outside(decl))
    assert why is None and (case.Nq, case.Nk) == (128, 256)
    # the protocol has no Nk = 0 (a case needs a key), so no queries with equal lengths does not exist
    decl = Declarations.make(same_length=True)
    case, why = project(catalogue.get("empty_queries"), decl, _outside(decl))
    assert case is None and "no queries" in why
