"""An FSDP's shards placed in the model by their values (experiments/shard_locate.py), and
the gradient check that compares them there."""

import torch

from cs336sys.experiments.shard_locate import WholeModel
from cs336sys.experiments.training_check import TrainingReference, gradient_problem


def _reference(world_size: int = 2) -> TrainingReference:
    g = torch.Generator().manual_seed(0)
    initial = {"emb.weight": torch.randn(4, 6, generator=g),
               "norm.weight": torch.ones(5),  # one value, many places: never located
               "out.weight": torch.randn(3, 5, generator=g)}
    mean = {k: torch.randn(v.shape, generator=g) for k, v in initial.items()}
    local = {k: torch.randn(v.shape, generator=g) for k, v in initial.items()}
    return TrainingReference(initial, {}, mean, local, world_size)


def _flat_shard(tensors: dict) -> torch.Tensor:
    """Rank 0's half of one flat buffer of out.weight then emb.weight (not the model's
    order), padded to an even length, as a flat-buffer FSDP keeps it."""
    flat = torch.cat([tensors["out.weight"].reshape(-1), tensors["emb.weight"].reshape(-1)])
    flat = torch.cat([flat, flat.new_zeros(flat.numel() % 2)])
    return flat[: flat.numel() // 2].clone()


def test_values_place_each_element_and_skip_those_that_repeat():
    ref = _reference()
    whole = WholeModel(ref.initial)
    shard = torch.cat([ref.initial["out.weight"][1], torch.ones(2)])  # row 1, two norm ones
    at, where = whole.locate(shard)
    assert at.tolist() == [0, 1, 2, 3, 4]
    lo, _ = whole.offsets["out.weight"]
    assert where.tolist() == [lo + 5 + i for i in range(5)]
    assert whole.names_at(where) == ["out.weight"]
    assert whole.locate(torch.full((10,), 7.0)) is None  # values the model never held


def test_a_flat_buffer_shard_under_a_name_of_its_own_is_checked():
    """A flat-buffer FSDP (one parameter `flat_shard` holding slices of many weights) that
    summed its gradients passed: no model name ended its name, so its gradient went
    uncompared, and AdamW hides a sum in the parameters. The course's test fails it."""
    ref = _reference()
    values = {"flat_shard": _flat_shard(ref.initial)}
    mean = _flat_shard(ref.grads)
    assert gradient_problem({"flat_shard": mean}, ref, 1e-3, values) is None
    summed = gradient_problem({"flat_shard": 2 * mean}, ref, 1e-3, values)
    assert summed is not None and "summed, not averaged" in summed
    own = gradient_problem({"flat_shard": _flat_shard(ref.local_grads)}, ref, 1e-3, values)
    assert own is not None and "never all-reduced" in own
    # not reduced, but divided by the world size: it read "they match neither ..."
    halved = gradient_problem({"flat_shard": _flat_shard(ref.local_grads) / 2}, ref, 1e-3,
                              values)
    assert halved is not None and ("match rank 0's own slice of the batch / world_size (2): "
                                   "divided by the world size but never all-reduced") in halved
    whole = gradient_problem({"out.weight": ref.local_grads["out.weight"] / 2}, ref, 1e-3)
    assert whole is not None and "divided by the world size but never all-reduced" in whole
    wrong = gradient_problem({"flat_shard": mean + 1}, ref, 1e-3, values)
    assert wrong is not None and "flat_shard (parts of 2 weights)" in wrong


def test_summed_and_twice_divided_are_told_by_the_world_size():
    """At 3 ranks a sum is 3 x the mean and a double division the mean / 3 (every case
    above is at 2, where a factor of 2 would pass for the world size)."""
    ref = _reference(world_size=3)
    mean = ref.grads["out.weight"]
    summed = gradient_problem({"out.weight": 3 * mean}, ref, 1e-3)
    assert summed is not None and "match world_size (3) x the reference: summed" in summed
    assert gradient_problem({"out.weight": 2 * mean}, ref, 1e-3).find("summed") == -1
    twice = gradient_problem({"out.weight": mean / 3}, ref, 1e-3)
    assert twice is not None and "match the reference / world_size (3): divided" in twice


def test_a_shard_that_holds_another_ranks_gradient_is_named():
    """Rank r keeping the reduced gradient of chunk r + 1 was `wrong` with a number only:
    the gradient matched the mean under the later-chunk layout, so it looked right, and
    the parameters' error was blamed on the norm that moved most."""
    ref = _reference()
    values = {"module.emb.weight": ref.initial["emb.weight"][:2].clone()}  # rank 0: rows 0-1
    right = {"module.emb.weight": ref.grads["emb.weight"][:2].clone()}
    assert gradient_problem(right, ref, 1e-3, values) is None
    other = {"module.emb.weight": ref.grads["emb.weight"][2:].clone()}  # rank 1's rows
    said = gradient_problem(other, ref, 1e-3, values)
    assert said is not None and "another part of their weight" in said
    assert "emb.weight" in said
    # a reversed layout (rank 0 holds the last rows) with its own gradient is right
    values = {"module.emb.weight": ref.initial["emb.weight"][2:].clone()}
    assert gradient_problem(other, ref, 1e-3, values) is None


def test_a_shard_whose_values_are_not_the_models_is_compared_by_its_name():
    """A master copy cast to 16 bits holds values the model never had: its shard is
    compared under the layouts its name allows, as before."""
    ref = _reference()
    values = {"emb.weight": ref.initial["emb.weight"][:2].to(torch.bfloat16)}
    summed = gradient_problem({"emb.weight": 2 * ref.grads["emb.weight"][:2]}, ref, 1e-3, values)
    assert summed is not None and "summed, not averaged" in summed


def test_values_a_16_bit_master_meets_by_chance_are_no_place():
    """A right FSDP whose fp32 master came through 16 bits (`shard.to(fp16).float()`) was
    `wrong` at 22M parameters: its rounded values met the model's exactly representable
    ones, 14-15 % of the shard found, most of it in other weights (benchmarks/
    shard_locate.py). Here another weight holds every rounded value once: the shard's name
    says where it must be."""
    g = torch.Generator().manual_seed(1)
    a = torch.randn(8, 6, generator=g)
    held = a[:4].to(torch.bfloat16).float()  # rank 0's master, rounded once
    elsewhere = held.reshape(-1).unique()
    initial = {"a.weight": a, "b.weight": elsewhere[torch.randperm(elsewhere.numel(),
                                                                   generator=g)]}
    mean = {k: torch.randn(v.shape, generator=g) for k, v in initial.items()}
    ref = TrainingReference(initial, {}, mean, {k: torch.zeros_like(v) for k, v in mean.items()},
                            2)
    values = {"module.a.weight": held}
    right = {"module.a.weight": mean["a.weight"][:4].clone()}
    assert gradient_problem(right, ref, 1e-3, values) is None
    summed = gradient_problem({"module.a.weight": 2 * mean["a.weight"][:4]}, ref, 1e-3, values)
    assert summed is not None and "summed, not averaged" in summed
