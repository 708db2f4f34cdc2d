"""Policy loss: against a per-token loop, gradients, clipping, masking and KL estimators."""

import math

import pytest
import torch

from trace_train.update.loss import PolicyLossConfig, kl_penalty, policy_loss


def loop_loss(logp, old, adv, mask, cfg):
    """The obvious implementation, one token at a time."""
    per_seq = []
    for b in range(len(logp)):
        terms = []
        for t in range(len(logp[b])):
            if mask[b][t]:
                ratio = math.exp(logp[b][t] - old[b][t])
                clipped = min(max(ratio, 1 - cfg.clip_low), 1 + cfg.clip_high)
                terms.append(-min(ratio * adv[b][t], clipped * adv[b][t]))
        per_seq.append(terms)
    if cfg.aggregation == "token_mean":
        flat = [x for seq in per_seq for x in seq]
        return sum(flat) / len(flat)
    seqs = [seq for seq in per_seq if seq]
    if cfg.aggregation == "seq_mean_token_mean":
        return sum(sum(s) / len(s) for s in seqs) / len(seqs)
    return sum(sum(s) for s in seqs) / len(seqs)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"])
def test_matches_loop(aggregation):
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(4, 7, generator=g, dtype=torch.float64)
    old = logp + 0.4 * torch.randn(4, 7, generator=g, dtype=torch.float64)
    adv = torch.randn(4, 7, generator=g, dtype=torch.float64)
    mask = (torch.rand(4, 7, generator=g) < 0.6).to(torch.float64)
    mask[2] = 0  # a sequence with no trained tokens is ignored, not averaged in as zero
    cfg = PolicyLossConfig(clip_low=0.2, clip_high=0.28, aggregation=aggregation)
    loss, _ = policy_loss(logp, old, adv, mask, cfg)
    assert float(loss) == pytest.approx(loop_loss(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), cfg), rel=1e-12)


def test_on_policy_gradient_is_reinforce():
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    adv = torch.tensor([[1.0, -2.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = policy_loss(logp, logp.detach(), adv, mask)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, 1.0, 0.0]]))  # -A * mask / (2 tokens)
    assert metrics["clip_fraction"] == 0.0 and metrics["ratio_mean"] == pytest.approx(1.0)


def test_clipping_stops_the_gradient_only_in_the_harmful_direction():
    old = torch.zeros(1, 2)
    logp = torch.tensor([[math.log(1.5), math.log(1.5)]], requires_grad=True)  # ratio 1.5 > 1.2
    adv = torch.tensor([[1.0, -1.0]])
    loss, metrics = policy_loss(logp, old, adv, torch.ones(1, 2))
    loss.backward()
    assert logp.grad[0, 0] == 0.0  # positive advantage, ratio already high: clipped, no push further
    assert logp.grad[0, 1] != 0.0  # negative advantage: the unclipped term is the minimum, still pushed down
    assert metrics["clip_fraction"] == 0.5


def test_masked_tokens_do_not_matter():
    g = torch.Generator().manual_seed(1)
    logp, old, adv = (torch.randn(2, 5, generator=g) for _ in range(3))
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.float32)
    base, _ = policy_loss(logp, old, adv, mask)
    noisy = torch.where(mask.bool(), adv, adv + 100.0)
    assert float(policy_loss(logp, old, noisy, mask)[0]) == pytest.approx(float(base))


def test_kl_estimators():
    logp = torch.tensor([-1.0, -2.0, -0.3])
    assert torch.all(kl_penalty(logp, logp) == 0)
    ref = logp + torch.tensor([0.5, -0.5, 1.0])
    k3 = kl_penalty(logp, ref, "k3")
    assert torch.all(k3 >= 0)
    d = ref - logp
    assert torch.allclose(kl_penalty(logp, ref, "k1"), -d) and torch.allclose(kl_penalty(logp, ref, "k2"), d * d / 2)
    # The KL term enters the loss with its coefficient.
    lp = logp[None]
    loss0, _ = policy_loss(lp, lp, torch.zeros_like(lp), torch.ones_like(lp), ref_logprobs=ref[None])
    loss1, m = policy_loss(lp, lp, torch.zeros_like(lp), torch.ones_like(lp), PolicyLossConfig(kl_coef=0.1), ref_logprobs=ref[None])
    assert float(loss1 - loss0) == pytest.approx(0.1 * float(k3.mean()), rel=1e-6) and m["kl"] == pytest.approx(float(k3.mean()))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(clip_low=0.0), r"`clip_low` must lie in \(0, 10\), got 0.0"),
        (dict(clip_high=-1), r"`clip_high` must lie in \(0, 10\), got -1"),
        (dict(kl_coef=-0.1), r"`kl_coef` must be finite and >= 0, got -0.1"),
        (dict(kl_estimator="k4"), r"`kl_estimator` must be one of \('k1', 'k2', 'k3'\), got 'k4'"),
        (dict(aggregation="mean"), r"`aggregation` must be one of"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PolicyLossConfig(**kwargs)


def test_call_errors():
    x = torch.zeros(1, 3)
    with pytest.raises(ValueError, match=r"must share one 2-D shape"):
        policy_loss(x, x, torch.zeros(1, 2), x)
    with pytest.raises(ValueError, match=r"`ref_logprobs` is required when `kl_coef` > 0"):
        policy_loss(x, x, x, x, PolicyLossConfig(kl_coef=0.1))


def test_token_weights_count_a_token_as_several():
    g = torch.Generator().manual_seed(3)
    logp, old, adv = (torch.randn(1, 3, generator=g, dtype=torch.float64) for _ in range(3))
    weights = torch.tensor([[2.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.float64)
    weighted, _ = policy_loss(logp, old, adv, mask, token_weights=weights)
    # Weight 2 on the first token equals writing that token twice (the third, weight 0, drops out).
    dup = lambda t: torch.cat([t[:, :1], t[:, :1], t[:, 1:2]], dim=1)  # noqa: E731
    expanded, _ = policy_loss(dup(logp), dup(old), dup(adv), torch.ones(1, 3, dtype=torch.float64))
    assert float(weighted) == pytest.approx(float(expanded), rel=1e-12)
    with pytest.raises(ValueError, match=r"`token_weights` must be non-negative and shaped like `logprobs`"):
        policy_loss(logp, old, adv, mask, token_weights=-weights)


def _expected_gradient(estimator: str, theta: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """E_{y ~ pi}[grad k(y)] exactly: the sum over the vocabulary of pi(y) times the loss term's gradient
    at a sampled y (the sample, hence pi(y) as a weight, held fixed, as a loss term does)."""
    total = torch.zeros_like(theta)
    pi = torch.softmax(theta, -1).detach()
    ref = torch.log_softmax(ref_logits, -1)
    for y in range(theta.numel()):
        t = theta.clone().requires_grad_(True)
        k = kl_penalty(torch.log_softmax(t, -1)[y], ref[y], estimator)
        (g,) = torch.autograd.grad(k, t)
        total += pi[y] * g
    return total


def test_kl_estimators_have_the_documented_gradients_inside_the_loss():
    """k2: grad KL(pi || ref); k3: grad KL(ref || pi); k1: zero (so it is refused as a loss term)."""
    torch.manual_seed(0)
    theta, ref_logits = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)

    def grad_of(kl):
        t = theta.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(kl(torch.log_softmax(t, -1), torch.log_softmax(ref_logits, -1)), t)
        return g

    forward = grad_of(lambda lp, lr: (lp.exp() * (lp - lr)).sum())   # KL(pi || ref)
    reverse = grad_of(lambda lp, lr: (lr.exp() * (lr - lp)).sum())   # KL(ref || pi)
    assert not torch.allclose(forward, reverse, atol=1e-3)
    torch.testing.assert_close(_expected_gradient("k2", theta, ref_logits), forward)
    torch.testing.assert_close(_expected_gradient("k3", theta, ref_logits), reverse)
    torch.testing.assert_close(_expected_gradient("k1", theta, ref_logits), torch.zeros_like(theta))
    with pytest.raises(ValueError, match="'k1' has zero expected gradient inside the loss"):
        PolicyLossConfig(kl_coef=0.1, kl_estimator="k1")
    PolicyLossConfig(kl_coef=0.0, kl_estimator="k1")  # as a logged value only: allowed


def test_the_loss_reports_the_metrics_it_declares_and_both_layouts_hold_one_input_record():
    """``LOSS_METRICS`` names what ``policy_loss`` returns (the trainer logs every one, ``ratio_mean``
    included); the leaf rows and the packed trees carry their per-token inputs as one ``LossInputs``."""
    from trace_train.update.loss import LOSS_METRICS, LossInputs
    from trace_train.update.packing import PackedTrees
    from trace_train.update.sequences import TrainingSequences

    logp = torch.zeros(2, 3)
    _, metrics = policy_loss(logp, logp, torch.ones(2, 3), torch.ones(2, 3), PolicyLossConfig())
    assert tuple(metrics) == LOSS_METRICS
    inputs = LossInputs(torch.ones(2, 3), logp, torch.ones(2, 3), torch.ones(2, 3))
    loss, again = inputs.loss(logp, PolicyLossConfig())
    assert again == metrics and float(loss) == float(policy_loss(logp, logp, torch.ones(2, 3), torch.ones(2, 3),
                                                                 PolicyLossConfig())[0])
    for layout in (PackedTrees, TrainingSequences):
        assert layout.__dataclass_fields__["inputs"].type in ("LossInputs", LossInputs)
