"""Root and prefix allocation: exact optimality against exhaustive search, constraints and errors."""

import itertools

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from trace_theory import (
    allocate_prefixes,
    allocate_roots,
    beta_mixed_probability,
    flip_probability,
    mixed_probability,
    root_utility,
)

from .strategies import probability_arrays, tie_free_probabilities


def best_root_value(v, budget, lo, hi, kappa=None):
    """Exhaustive dynamic programme over prompts: the best total utility, or None if infeasible."""

    def utility(i, m):
        if kappa is None:
            return float(mixed_probability(v[i], m))
        return float(beta_mixed_probability(v[i] * kappa[i], (1 - v[i]) * kappa[i], m)) if 0 < v[i] < 1 else 0.0

    best = {0: 0.0}
    for i in range(len(v)):
        nxt = {}
        for spent, value in best.items():
            for m in [0, *range(lo, hi + 1)]:
                if spent + m > budget:
                    break
                total = value + utility(i, m)
                if total > nxt.get(spent + m, -1.0):
                    nxt[spent + m] = total
        best = nxt
    return best.get(budget)


root_cases = st.tuples(
    probability_arrays(min_size=1, max_size=6),
    st.integers(0, 24),
    st.integers(1, 3),
    st.one_of(st.none(), st.integers(1, 6)),
)


@given(root_cases)
@example((np.array([0.5, 0.5, 0.5]), 5, 2, None))
@example((np.array([0.0, 1.0, 0.0]), 6, 2, 2))  # all budget forced onto useless prompts
@example((np.array([0.9, 0.1, 0.5, 0.99]), 7, 2, 3))
@example((np.array([1e-9, 0.3]), 11, 3, None))
def test_roots_equal_exhaustive_search(case):
    v, budget, lo, cap = case
    hi = max(budget, lo) if cap is None else max(cap, lo)
    best = best_root_value(v, budget, lo, hi)
    if best is None:
        with pytest.raises(ValueError, match=r"cannot be split over"):
            allocate_roots(v, budget, min_group=lo, max_group=hi)
        return
    m = allocate_roots(v, budget, min_group=lo, max_group=hi)
    assert m.dtype == np.int64 and m.sum() == budget
    assert np.all((m == 0) | ((m >= lo) & (m <= hi)))
    assert root_utility(v, m) == pytest.approx(best, abs=1e-9)


@given(probability_arrays(min_size=1, max_size=5), st.integers(0, 16), st.lists(st.floats(0.3, 30), min_size=5, max_size=5))
def test_beta_posterior_roots_equal_exhaustive_search(v, budget, kappa):
    kappa = np.array(kappa[: len(v)])
    best = best_root_value(v, budget, 2, max(budget, 2), kappa)
    assume(best is not None)
    m = allocate_roots(v, budget, concentration=kappa)
    assert m.sum() == budget
    assert root_utility(v, m, concentration=kappa) == pytest.approx(best, abs=1e-9)


@given(tie_free_probabilities(max_size=6), st.integers(2, 30), st.randoms(use_true_random=False))
def test_roots_are_permutation_equivariant_without_ties(v, budget, random):
    perm = np.arange(len(v))
    random.shuffle(perm)
    m = allocate_roots(v, budget)
    assert allocate_roots(v[perm], budget).tolist() == m[perm].tolist()


@given(root_cases)
def test_roots_are_deterministic_and_leave_inputs_alone(case):
    v, budget, lo, cap = case
    before = v.copy()
    try:
        first = allocate_roots(v, budget, min_group=lo, max_group=cap if cap is None else max(cap, lo))
    except ValueError:
        return
    assert allocate_roots(v, budget, min_group=lo, max_group=cap if cap is None else max(cap, lo)).tolist() == first.tolist()
    assert np.array_equal(v, before)


def test_roots_zero_budget_and_filtering():
    assert allocate_roots([0.3, 0.6], 0).tolist() == [0, 0]
    assert allocate_roots([], 0).tolist() == []
    # Certain outcomes are filtered out while anything else can use the budget.
    m = allocate_roots([0.0, 1.0, 0.4, 0.6, 1.0], 16)
    assert m[[0, 1, 4]].tolist() == [0, 0, 0] and m.sum() == 16


def test_roots_large_instance_against_a_heap_greedy_bound():
    """On a realistic pool the exact answer is at least as good as the greedy that pairs first units."""
    import heapq

    rng = np.random.default_rng(0)
    v = rng.beta(0.5, 0.5, 400)
    budget = 3200
    m = allocate_roots(v, budget, max_group=32)
    # Greedy baseline: activate prompts by their value for two rollouts, then add single rollouts.
    counts = np.zeros_like(m)
    heap = [(-float(mixed_probability(x, 2)), i, 2) for i, x in enumerate(v)]
    heapq.heapify(heap)
    left = budget
    while left:
        gain, i, step = heapq.heappop(heap)
        if step > left:
            continue
        counts[i] += step
        left -= step
        if counts[i] < 32:
            heapq.heappush(heap, (-float(mixed_probability(v[i], counts[i] + 1) - mixed_probability(v[i], counts[i])), i, 1))
    assert counts.sum() == budget
    assert root_utility(v, m) >= root_utility(v, counts) - 1e-9


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(v=[0.5, 0.5], budget=1), r"`budget` 1 cannot be split over 2 prompts into groups of size 0 or 2..2"),
        (dict(v=[0.5], budget=9, max_group=8), r"`budget` 9 cannot be split over 1 prompts into groups of size 0 or 2..8"),
        (dict(v=[0.5, 0.5], budget=3, min_group=2, max_group=2), r"cannot be split over 2 prompts"),
        (dict(v=[], budget=2), r"cannot be split over 0 prompts"),
        (dict(v=[0.5], budget=-1), r"`budget` must be a non-negative integer, got -1"),
        (dict(v=[0.5], budget=2.5), r"`budget` must be a non-negative integer, got 2.5"),
        (dict(v=[0.5], budget=2, min_group=0), r"`min_group` must be at least 1, got 0"),
        (dict(v=[0.5], budget=2, max_group=1), r"`max_group` \(1\) must be at least `min_group` \(2\)"),
        (dict(v=[1.2], budget=2), r"`v` must lie in \[0, 1\], got 1.2"),
        (dict(v=[[0.5]], budget=2), r"`v` must be one-dimensional, got shape \(1, 1\)"),
        (dict(v=[0.5], budget=2, concentration=0.0), r"`concentration` must be finite and positive, got 0.0"),
        # Found by the adversarial review (issue 10): these were broadcast, converted or crashed.
        (dict(v=[0.5, 0.5], budget=4, concentration=[1.0, 2.0, 3.0]),
         r"`concentration` must be a scalar or hold one value per prompt \(2\), got shape \(3,\)"),
        (dict(v=[0.5, 0.5, 0.5], budget=4, concentration=[2.0]),
         r"`concentration` must be a scalar or hold one value per prompt \(3\), got shape \(1,\)"),
        (dict(v=[0.5, 0.5], budget=4, concentration=[[1.0], [2.0]]),
         r"`concentration` must be a scalar or hold one value per prompt \(2\), got shape \(2, 1\)"),
        (dict(v=[0.5], budget="4"), r"`budget` must be a non-negative integer, got '4'"),
        (dict(v=[0.5], budget=4 + 0j), r"`budget` must be a non-negative integer, got \(4\+0j\)"),
        (dict(v=[0.5], budget=1e300), r"`budget` must be a non-negative integer, got 1e\+300"),
        (dict(v=[0.5], budget=float("nan")), r"`budget` must be a non-negative integer, got nan"),
        (dict(v=[0.5], budget=[4]), r"`budget` must be a non-negative integer, got \[4\]"),
    ],
)
def test_root_errors(kwargs, message):
    v = kwargs.pop("v")
    budget = kwargs.pop("budget")
    with pytest.raises(ValueError, match=message):
        allocate_roots(v, budget, **kwargs)


# ---------------------------------------------------------------------------------------------------
# Roots, budgets far above the prompt count: the closed-form solver against the table and the optimum
# ---------------------------------------------------------------------------------------------------


def solve_roots(v, budget, lo, cap, method):
    """``allocate_roots`` with the solver forced (``"table"``: today's doubling table, the reference)."""
    from trace_theory.allocate import _solve_roots

    hi = max(budget, lo) if cap is None else max(cap, lo)
    return _solve_roots(np.asarray(v, dtype=float), None, budget, lo, min(hi, budget), method=method)


@given(root_cases)
@example((np.array([0.5, 0.5, 0.5]), 5, 2, None))
@example((np.array([0.0, 1.0, 0.0]), 6, 2, 2))
@example((np.array([1e-9, 0.3]), 11, 3, None))
@example((np.array([1.0, 1.0]), 8, 1, None))
def test_closed_form_roots_equal_exhaustive_search(case):
    v, budget, lo, cap = case
    hi = max(budget, lo) if cap is None else max(cap, lo)
    best = best_root_value(v, budget, lo, hi)
    assume(best is not None and budget > 0)
    m = solve_roots(v, budget, lo, hi, "closed_form")
    assert m.dtype == np.int64 and m.sum() == budget
    assert np.all((m == 0) | ((m >= lo) & (m <= hi)))
    assert root_utility(v, m) == pytest.approx(best, abs=1e-9)


EDGES = np.array([0.0, 1.0, 1e-9, 1 - 1e-9, 1e-3, 0.5, 0.3])


def random_root_case(rng):
    """n <= 10 prompts (uniform, Beta(0.5, 0.5), edge values or a mix), min_group 1..4, a budget up to
    1000 rollouts per prompt, and a cap half of the time."""
    n = int(rng.integers(1, 11))
    v = [rng.random(n), rng.beta(0.5, 0.5, n), rng.choice(EDGES, n), np.where(rng.random(n) < 0.3, rng.choice(EDGES[:4], n), rng.random(n))][rng.integers(4)]
    lo = int(rng.integers(1, 5))
    budget = int(rng.integers(1, n * int(rng.choice([2, 10, 100, 1000])) + 1))
    cap = None if rng.random() < 0.5 else int(rng.integers(lo, max(lo, budget) + 2))
    return v, budget, lo, cap


def test_closed_form_roots_equal_the_table_on_random_pools():
    """Identical to today's doubling table, tie for tie, wherever distinct answers differ in value by more
    than rounding: no prompt with 0 < v (1 - v) < 1e-6 (its utility is linear to ~1e-15, so splits of it
    are ties) and a threshold lambda* >= 1e-10 (below it, units differ by less than the 1e-12 tolerance).
    Elsewhere both are optimal up to that tolerance per prompt."""
    from trace_theory._roots_closed_form import _closed_form_threshold
    from trace_theory.allocate import check_root_budget

    rng = np.random.default_rng(20261201)
    strict = 0
    for _ in range(2000):
        v, budget, lo, cap = random_root_case(rng)
        try:
            check_root_budget(len(v), budget, lo, max(budget, lo) if cap is None else cap)
        except ValueError:
            continue
        want = solve_roots(v, budget, lo, cap, "table")
        got = solve_roots(v, budget, lo, cap, "closed_form")
        assert got.sum() == budget and np.all((got == 0) | ((got >= lo) & (got <= (cap or budget))))
        lam, _ = _closed_form_threshold(v, budget, lo, min(cap or budget, budget))
        if not ((v * (1 - v) > 0) & (v * (1 - v) < 1e-6)).any() and lam >= 1e-10:
            strict += 1
            assert got.tolist() == want.tolist(), (v.tolist(), budget, lo, cap)
        else:
            assert root_utility(v, got) >= root_utility(v, want) - len(v) * 1e-12, (v.tolist(), budget, lo, cap)
    assert strict > 800  # most cases are held to identity


@pytest.mark.parametrize(
    "pool, edges, tolerance",
    [
        ("beta", [0.0, 1.0, 0.5, 0.5], 0.0),
        ("beta", [0.0, 1.0, 1e-9, 1 - 1e-9, 0.5, 0.5], 0.0),
        # Uniform pass rates put ~1e-3 near 0 and 1: lambda* ~ 1e-20, so the last units are ties within
        # the 1e-12 tolerance and the certificate can only hold up to it.
        ("uniform", [0.0, 1.0, 1e-9, 1 - 1e-9, 0.5, 0.5], 1e-12),
    ],
)
def test_roots_with_budget_far_above_the_prompt_count_are_optimal(pool, edges, tolerance):
    """1,000 prompts, budget 10^6 (groups of up to ~10^5): a Lagrangian certificate proves the optimum.

    With min_group 2 the concave envelope of mixed(v, m) has unit values v (1 - v), v (1 - v), then the
    gains g(m) = v^m (1 - v) + (1 - v)^m v for m >= 2, and equals mixed(v, m) on {0} U [2, U]. So m is
    optimal if some lambda lies between every next unit's value and every last taken unit's value:
    then each m_i maximises envelope_i(m) - lambda m, and no feasible allocation does better.
    """
    rng = np.random.default_rng(3)
    v = rng.beta(0.5, 0.5, 1000) if pool == "beta" else rng.random(1000)
    v[: len(edges)] = edges
    budget = 10**6
    m = allocate_roots(v, budget)
    assert m.sum() == budget and np.all((m == 0) | (m >= 2))
    pair = v * (1 - v)

    def gain(k):
        k = np.maximum(k, 0).astype(float)
        return np.where(k >= 2, v**k * (1 - v) + (1 - v) ** k * v, pair)

    last = np.where(m > 0, gain(m - 1), np.inf)  # value of the last unit taken
    nxt = np.where(m < budget, gain(m), -np.inf)  # value of the next unit (activation: v (1 - v))
    assert nxt.max() <= last.min() + tolerance
    assert (m > 0).sum() > 900 and m.max() > 10 * budget / 1000  # the large groups that made tables wide


# ---------------------------------------------------------------------------------------------------
# Prefixes
# ---------------------------------------------------------------------------------------------------


def best_prefix_value(v, r, prompt, budget, cap):
    """Exhaustive search per prompt; returns (best total flip, unspent per prompt)."""
    total, unspent = 0.0, []
    for g, b in enumerate(budget):
        idx = np.flatnonzero(prompt == g)
        usable = b if cap is None else min(b, cap * len(idx))
        if len(idx) == 0:
            usable = 0
        unspent.append(int(b - usable))
        if not len(idx):
            continue
        top = usable if cap is None else min(cap, usable)
        best = max(
            float(flip_probability(v[idx], r[idx], np.array(ks)).sum())
            for ks in itertools.product(range(top + 1), repeat=len(idx))
            if sum(ks) == usable
        )
        total += best
    return total, unspent


prefix_cases = st.integers(0, 5).flatmap(
    lambda n: st.tuples(
        probability_arrays(min_size=n, max_size=n),
        st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n).map(np.array),
        st.lists(st.integers(0, 2), min_size=n, max_size=n).map(lambda x: np.array(x, dtype=np.int64)),
        st.lists(st.integers(0, 6), min_size=3, max_size=3).map(np.array),
        st.one_of(st.none(), st.integers(0, 3)),
    )
)


@given(prefix_cases)
@example((np.array([0.9, 0.9, 0.5]), np.array([0.0, 1.0, 1.0]), np.array([0, 0, 0]), np.array([3, 0, 0]), None))
@example((np.array([1.0, 0.0]), np.array([1.0, 1.0]), np.array([1, 1]), np.array([0, 5, 2]), None))
@example((np.array([0.5, 0.5]), np.array([0.0, 1.0]), np.array([0, 0]), np.array([6, 0, 0]), 2))
def test_prefixes_equal_exhaustive_search(case):
    v, r, prompt, budget, cap = case
    out = allocate_prefixes(v, r, prompt, budget, max_per_anchor=cap)
    best, unspent = best_prefix_value(v, r, prompt, budget, cap)
    assert out.k.dtype == np.int64 and np.all(out.k >= 0)
    assert cap is None or np.all(out.k <= cap)
    assert out.unspent.tolist() == unspent
    assert np.bincount(prompt, weights=out.k, minlength=len(budget)).tolist() == (budget - out.unspent).tolist()
    assert float(flip_probability(v, r, out.k).sum()) == pytest.approx(best, abs=1e-9)


def test_prefix_budget_of_a_prompt_without_anchors_is_returned():
    out = allocate_prefixes([0.5, 0.5], [1, 0], [0, 0], [4, 7])
    assert out.k.sum() == 4 and out.unspent.tolist() == [0, 7]


def test_prefixes_prefer_surprising_outcomes():
    # Same prediction, different factual outcomes: branch where the outcome was the unlikely one.
    out = allocate_prefixes([0.8, 0.8], [0, 1], [0, 0], [1])
    assert out.k.tolist() == [1, 0]


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (([0.5], [1], [0], [-2]), {}, r"`budget` must be non-negative integers, got -2"),
        (([0.5], [1], [3], [2]), {}, r"`prompt` ids must lie in \[0, 0\] \(one budget per prompt\), got 3"),
        (([0.5, 0.2], [1], [0, 0], [2]), {}, r"arrays must have the same length: `v` has 2, `r` has 1, `prompt` has 2"),
        (([0.5], [1.5], [0], [2]), {}, r"`r` must lie in \[0, 1\], got 1.5"),
        (([0.5], [1], [0.5], [2]), {}, r"`prompt` must be non-negative integers, got 0.5"),
        (([0.5], [1], [0], [2]), {"max_per_anchor": -1}, r"`max_per_anchor` must be a non-negative integer, got -1"),
    ],
)
def test_prefix_errors(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        allocate_prefixes(*args, **kwargs)


@pytest.mark.parametrize(
    "budget, message",
    [
        (["3"], r"`budget` must be non-negative integers, got values of dtype <U1"),
        ([2.5], r"`budget` must be non-negative integers, got 2.5"),
        ([1e19], r"`budget` must be non-negative integers, got 1e\+19"),
    ],
)
def test_prefix_budgets_must_be_integers(budget, message):
    args = ([0.5], [1], [0], budget)
    with pytest.raises(ValueError, match=message):
        allocate_prefixes(*args)


def test_root_utility_concentration_must_match_v():
    with pytest.raises(ValueError, match=r"`concentration` must be a scalar or have the shape of `v` \(2,\), got shape \(3,\)"):
        root_utility([0.5, 0.5], [2, 2], concentration=[1.0, 2.0, 3.0])


def test_prefix_allocation_near_certain_repeat_does_not_enumerate_the_bracket():
    """q within rounding of 1: the bracket of near-equal gains held ~4e7 units before the fix (350 MB)."""
    import tracemalloc

    tracemalloc.start()
    out = allocate_prefixes([1 - 1.1e-16], [1], [0], [16])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert out.k.tolist() == [16]
    assert peak < 1_000_000  # bytes


# ---------------------------------------------------------------------------------------------------
# Prefixes: identical to the obvious greedy, tie for tie (the water level is found by Illinois steps)
# ---------------------------------------------------------------------------------------------------


from trace_theory._water_fill import _FLOOR  # noqa: E402


def greedy_prefixes(v, r, prompt, budget, cap):
    """Per prompt, take units by largest log gain k log q + log(1 - q), ties to lower anchor ids; when no
    worthwhile unit is left, fill worthless ones in anchor order up to the cap. Returns (k, unspent).
    A unit whose log gain is below the allocator's documented floor (``_FLOOR``, under every positive
    double) is worthless, as in the allocator."""
    import heapq
    import math

    q = r * v + (1 - r) * (1 - v)
    k = np.zeros(len(q), dtype=np.int64)
    cap = math.inf if cap is None else cap
    unspent = []

    def log_gain(a):
        if q[a] == 0.0:
            return 0.0 if k[a] == 0 else -math.inf
        if q[a] == 1.0:
            return -math.inf
        value = k[a] * math.log(q[a]) + math.log1p(-q[a])
        return value if value >= _FLOOR else -math.inf

    for g, b in enumerate(budget):
        idx = np.flatnonzero(prompt == g).tolist()
        need = int(min(b, cap * len(idx))) if idx else 0
        unspent.append(int(b) - need)
        heap = [(-log_gain(a), a) for a in idx if cap > 0]
        heapq.heapify(heap)
        while need and heap and heap[0][0] < math.inf:
            _, a = heapq.heappop(heap)
            k[a] += 1
            need -= 1
            if k[a] < cap:
                heapq.heappush(heap, (-log_gain(a), a))
        for a in idx:  # worthless units, in anchor order
            more = int(min(need, cap - k[a]))
            k[a] += more
            need -= more
    return k, unspent


tie_prone = st.sampled_from([0.0, 1.0, 0.5, 0.25, 0.75, 0.9, 1 - 1e-6, 1e-9])
large_prefix_cases = st.integers(1, 30).flatmap(
    lambda n: st.tuples(
        st.lists(st.one_of(tie_prone, st.floats(0.0, 1.0)), min_size=n, max_size=n).map(np.array),
        st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n).map(np.array),
        st.lists(st.integers(0, 3), min_size=n, max_size=n).map(lambda x: np.array(x, dtype=np.int64)),
        st.lists(st.integers(0, 400), min_size=4, max_size=4).map(np.array),
        st.one_of(st.none(), st.integers(0, 40)),
    )
)


@given(large_prefix_cases)
@example((np.array([0.5] * 6), np.array([1.0, 0.0] * 3), np.zeros(6, np.int64), np.array([400, 0, 0, 0]), None))
@example((np.array([1 - 1e-6, 0.3, 1 - 1e-6]), np.ones(3), np.zeros(3, np.int64), np.array([137, 0, 0, 0]), None))
@example((np.array([0.0, 1.0, 0.5]), np.array([1.0, 1.0, 0.0]), np.zeros(3, np.int64), np.array([90, 0, 0, 0]), 7))
@example((np.array([0.0, 1e-9, 0.0]), np.array([0.0, 1.0, 0.0]), np.zeros(3, np.int64), np.array([40, 0, 0, 0]), None))
def test_prefixes_equal_the_obvious_greedy_tie_for_tie(case):
    """Large budgets, equal gains across anchors, near-certain prefixes and budgets above the caps."""
    v, r, prompt, budget, cap = case
    out = allocate_prefixes(v, r, prompt, budget, max_per_anchor=cap)
    k, unspent = greedy_prefixes(v, r, prompt, budget, cap)
    assert out.k.tolist() == k.tolist()
    assert out.unspent.tolist() == unspent


def test_prefix_water_level_with_near_equal_gains_keeps_the_tie_order():
    """Two anchors with q = 1 - 1e-12 continuing from counts 2 and 1: their gains interleave, and the
    secant steps land on a unit's level exactly; a first version split 136 units 67 / 69, not 68 / 68."""
    from trace_theory.allocate import water_fill

    q = np.array([1 - 1e-12, 1 - 1e-12, 0.3])
    out = water_fill(q, np.array([0, 0, 1]), np.array([136, 0]), room=np.full(3, np.inf), start=np.array([2.0, 1.0, 0.0]))
    assert out.k.tolist() == [68, 68, 0]


@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from([-1.0, 0.0, 0.5, 2.0, np.inf])), min_size=0, max_size=60),
    st.lists(st.integers(-1, 12), min_size=6, max_size=6),
    st.booleans(),
)
def test_the_kth_largest_within_groups_is_read_off_a_lexsort_of_group_then_key(items, kth, sort_groups):
    """The per-group threshold of the water fill's last step: +inf where nothing is to be taken, -inf where
    a group has fewer items than asked for, else the kth largest, on the padded-rows path (sorted groups)
    and the lexsort path alike."""
    from trace_theory._water_fill import _kth_largest_in_groups

    group = np.array([g for g, _ in items], dtype=np.int64)
    key = np.array([k for _, k in items], dtype=float)
    if sort_groups:  # the padded-rows path needs sorted groups; unsorted ones take lexsort
        group = np.sort(group)
    kth = np.array(kth, dtype=np.int64)
    expected = []
    for g, kg in enumerate(kth):
        mine = sorted(key[group == g], reverse=True)
        expected.append(np.inf if kg <= 0 else -np.inf if kg > len(mine) else mine[kg - 1])
    got = _kth_largest_in_groups(key, group, kth, bool(sort_groups or len(group) < 2))
    np.testing.assert_array_equal(got, expected)


def test_prefix_allocation_with_no_budget_places_nothing_in_every_form():
    """No budget (eager expansion without a reserve, at a tree's end): zero counts and nothing unspent,
    whether the units are rollouts or tokens and whatever was placed before."""
    v, r, prompt = [0.3, 0.9, 0.5], [1, 0, 1], [0, 1, 1]
    for kwargs in ({}, {"cost": [0.5, 1.0, 2.0]}, {"start": [1, 0, 2]}, {"start": [1, 0, 2], "max_per_anchor": 2}):
        out = allocate_prefixes(v, r, prompt, [0, 0], **kwargs)
        assert out.k.tolist() == [0, 0, 0] and out.unspent.tolist() == [0, 0]
        assert out.k.dtype == np.int64 and out.unspent.dtype == np.int64
    with pytest.raises(ValueError, match="`start` must not exceed"):
        allocate_prefixes(v, r, prompt, [0, 0], start=[3, 0, 0], max_per_anchor=2)
