"""Rank 0's loss step by step against single-process training's on the same slice
(experiments/training_check.py: loss_problem), the cause a stale forward leaves."""

import torch

from cs336sys.experiments.training_check import (
    TrainingReference,
    loss_problem,
    training_check,
    training_reference,
)
from cs336sys.models.config import ModelConfig
from cs336sys.models.transformer import TransformerLM

FALLING = [6.97, 6.95, 6.94, 6.93]  # the reference's loss of rank 0's slice, step by step


def _reference(losses=FALLING) -> TrainingReference:
    return TrainingReference({}, {}, {}, {}, 2, list(losses))


def test_a_loss_that_stays_at_the_first_steps_says_the_forward_saw_stale_weights():
    """An FSDP that gathers the full weights once and reuses them was `wrong` with the norm
    that moved most as its cause; its loss stays at the first step's."""
    stale = [6.97, 6.9699, 6.9698, 6.9697]
    said = loss_problem(stale, _reference(), "fp32")
    assert said.startswith("rank 0's loss followed single-process training's on its slice "
                           "for 1 step and left it at step 2 (6.9699 against 6.95), then "
                           "stayed at the first step's")
    assert "the forward kept running on the first step's weights" in said
    # parameters that never moved have a cause of their own: no word of the loss
    start, final = {"w": torch.zeros(4)}, {"w": torch.ones(4)}
    reference = TrainingReference(start, final, {}, {}, 2, list(FALLING))
    verdict = training_check({"w": torch.zeros(4)}, reference, "fp32", losses=stale)
    assert "never left their initial values" in verdict.metrics["check_detail"]
    assert "first step's weights" not in verdict.metrics["check_detail"]


def test_a_loss_that_follows_or_never_matched_is_no_cause():
    assert loss_problem(list(FALLING), _reference(), "fp32") is None
    assert loss_problem([7.5, 7.4, 7.3, 7.2], _reference(), "fp32") is None  # the forward's
    assert loss_problem([6.97, 6.95], _reference(), "fp32") is None  # fewer steps, agreeing
    # a departure at step 3 that keeps falling says where, not why
    said = loss_problem([6.97, 6.95, 6.90, 6.85], _reference(), "fp32")
    assert "then stayed" not in said and "left it at step 3 (6.9 against 6.94)" in said
    # "stayed": it moved less than a tenth of the reference's 0.04; 0.012 (30 %) is moving
    said = loss_problem([6.97, 6.96, 6.962, 6.958], _reference(), "fp32")
    assert said is not None and "then stayed" not in said
    said = loss_problem([6.97, 6.969, 6.9685, 6.9685], _reference(), "fp32")  # 0.0015
    assert said is not None and "then stayed" in said
    # 16-bit compute is judged at 1 %: 6.96 is within it of 6.95
    assert loss_problem([6.97, 6.96, 6.94, 6.93], _reference(), "bf16") is None


def test_the_check_names_a_stale_forward_where_the_parameters_fail():
    start, final = {"w": torch.zeros(4)}, {"w": torch.ones(4)}
    reference = TrainingReference(start, final, {}, {}, 2, list(FALLING))
    verdict = training_check({"w": torch.full((4,), 0.5)}, reference, "fp32",
                             losses=[6.97, 6.9699, 6.9698, 6.9697])
    assert not verdict.passed
    assert "the forward kept running on the first step's weights" in verdict.metrics["check_detail"]
    # a cause found otherwise stands alone: another rank's gradient stalls the loss too
    grads = {"w": torch.full((4,), 2.0)}
    reference = TrainingReference(start, final, {"w": torch.ones(4)}, {"w": torch.ones(4)}, 2,
                                  list(FALLING))
    verdict = training_check({"w": torch.full((4,), 0.5)}, reference, "fp32", grads,
                             losses=[6.97, 6.9699, 6.9698, 6.9697])
    assert "summed, not averaged" in verdict.metrics["check_detail"]
    assert "loss" not in verdict.metrics["check_detail"]
    # a passing check says nothing of the losses
    verdict = training_check(dict(final), reference, "fp32", losses=[6.97, 7.0, 7.1, 7.2])
    assert verdict.passed and "loss" not in verdict.metrics["check_detail"]


def test_the_reference_records_the_loss_of_rank_0s_slice_before_each_step():
    config = ModelConfig(d_model=32, d_ff=64, num_layers=1, num_heads=2, vocab_size=97,
                         context_length=8)
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 97, (4, 8), generator=g)
    y = torch.randint(0, 97, (4, 8), generator=g)
    reference = training_reference(config, "cpu", 0, x, y, "fp32", 3, 2)
    torch.manual_seed(0)
    model = TransformerLM(config)
    with torch.no_grad():  # rank 0's slice (the first half) at the initial weights
        first = torch.nn.functional.cross_entropy(model(x[:2]).reshape(-1, 97), y[:2].reshape(-1))
    assert len(reference.local_losses) == 3
    assert abs(reference.local_losses[0] - float(first)) < 1e-5
    assert reference.local_losses[2] < reference.local_losses[0]  # it trains


def test_a_bit_exact_match_names_its_worst_parameter():
    """Every parameter equal to single-process training's to the bit: the detail read
    `worst 0 (None)`; it names the first parameter, as any other worst."""
    start, final = {"w": torch.zeros(4), "b": torch.zeros(2)}, {"w": torch.ones(4),
                                                                 "b": torch.ones(2)}
    reference = TrainingReference(start, final, {}, {}, 2, list(FALLING))
    verdict = training_check({k: v.clone() for k, v in final.items()}, reference, "fp32")
    assert verdict.passed
    assert "worst 0 (w" in verdict.metrics["check_detail"], verdict.metrics["check_detail"]


def test_a_gather_that_returned_the_shards_is_said_so():
    """fsdp_gather_full_params() returning each rank's shard read `token_embeddings.weight
    is (5000, 512)`, shapes alone: the model's shape and what the half most likely is are
    said beside it."""
    start, final = {"w": torch.zeros(8, 3), "b": torch.zeros(3)}, {"w": torch.ones(8, 3),
                                                                   "b": torch.ones(3)}
    reference = TrainingReference(start, final, {}, {}, 2, list(FALLING))
    verdict = training_check({"w": torch.ones(4, 3), "b": torch.ones(2)}, reference, "fp32")
    assert not verdict.passed
    assert ("w is (4, 3), the model's (8, 3) (2x fewer elements: this rank's shard, not the "
            "gathered weight?)") in verdict.why, verdict.why
    assert "b is (2,), the model's (3,)" in verdict.why and "(1.5x" not in verdict.why
