"""A CUDA kernel's demangled name, short enough to read in a table or on a plot's axis.

PyTorch's elementwise kernels demangle to hundreds of characters, nearly all of them the
signatures of the lambdas and functors they were instantiated with:

    void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<
    at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor
    <float> > >(at::TensorIteratorBase&, ...)::{lambda(int)#1}>(int, ...)

and cut to their first 48 characters, 11 of the 32 kernels of the H200's two profiled
points (reports/nvidia-h200, `SELECT DISTINCT name FROM kernel_stats`) read
`void at::native::vectorized_elementwise_kernel<…`, and three more
`void at::native::elementwise_kernel<128, 2, at:…`. What tells them apart is the
template's arguments: the op (MulFunctor, direct_copy_kernel_cuda, masked_fill_kernel).
`readable` keeps those and drops the rest, as Nsight Systems' "short names" do for the
function itself: the return type, parameter lists, namespaces, lambdas and `operator()`
hops, and the indexing, load and store arguments every elementwise kernel has. The store
keeps the name as the profiler gave it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_LAMBDA_HOPS = re.compile(r"::\{lambda[^{}]*\}|::operator\(\)(?: const)?")
_NAMESPACE = re.compile(r"(?:\(anonymous namespace\)|[A-Za-z_]\w*)::")
_REFERENCE = re.compile(r"\s*\bconst\b\s*&?|\s*&")
# Arguments every elementwise kernel of PyTorch's carries: how it indexes, loads and stores.
_PLUMBING = re.compile(r",\s*(?:array<char\*, \d+ul>|TrivialOffsetCalculator<[^<>]*>|"
                       r"(?:Load|Store)WithCast<\d+>)")


def _drop_parameter_lists(name: str) -> str:
    """Every parenthesised group that follows a name or a template's `>` (a function's
    parameters), but not `lambda(...)`'s or `operator()`'s own, nor `(anonymous namespace)`."""
    out: list[str] = []
    i = 0
    while i < len(name):
        c = name[i]
        before = "".join(out[-16:]).rstrip()  # enough to end with `operator`
        if c == "(" and before and (before[-1].isalnum() or before[-1] in "_>)") \
                and not before.endswith(("lambda", "operator")):
            depth = 0
            while i < len(name):  # skip to the matching bracket
                depth += {"(": 1, ")": -1}.get(name[i], 0)
                i += 1
                if depth == 0:
                    break
            continue
        out.append(c)
        i += 1
    return "".join(out)


def cut_middle(label: str, most: int) -> str:
    """`label` in at most `most` characters, its middle cut: a kernel's op is at its end
    (`elementwise_kernel<128, 2, …MulFunctor<float>>>>`), which a cut at the end loses."""
    if len(label) <= most:
        return label
    head = (most - 1) // 2
    return label[:head] + "…" + label[len(label) - (most - 1 - head):]


def cut_apart(labels: list[str], most: int) -> list[str]:
    """Each label in at most `most` characters (cut_middle), where two different labels
    would read alike, each keeps where it differs from the others instead of its middle:
    the H200's `vectorized_elementwise_kernel<4, AUnaryFunctor<…MulFunctor<float>>>` and its
    `BUnaryFunctor` twin read as one name on two bars."""
    cut = [cut_middle(x, most) for x in labels]
    for shown in set(cut):
        alike = [i for i, c in enumerate(cut) if c == shown]
        if len({labels[i] for i in alike}) < 2:
            continue
        for i in alike:
            full = labels[i]
            at = min(_common(full, labels[j]) for j in alike if labels[j] != full)
            ends = (most - 2) // 4  # the head and the tail each; the window the rest
            window = most - 2 - 2 * ends
            start = max(ends, min(at - window // 3, len(full) - ends - window))
            if start <= ends or start + window >= len(full) - ends:
                continue  # short enough that the middle's cut already kept it
            cut[i] = full[:ends] + "…" + full[start:start + window] + "…" + full[-ends:]
    return cut


def _common(a: str, b: str) -> int:
    """The length of the prefix `a` and `b` share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def readable(name: str, width: int | None = None) -> str:
    """`name` without what does not tell one kernel from another; with `width`, at most
    that many characters (its middle cut: a terminal's table). A name that is no C++
    signature (`aten::mm`, a Triton kernel's) is left as it is, but for the cut."""
    short = name
    if "(" in name or "<" in name:
        short = name.removeprefix("void ").strip()
        short = _drop_parameter_lists(short)
        short = _LAMBDA_HOPS.sub("", short)
        short = _NAMESPACE.sub("", short)
        short = _REFERENCE.sub("", short)
        short = _PLUMBING.sub("", short)
        short = re.sub(r"\s*>", ">", short)
        short = re.sub(r"\s+", " ", short).strip() or name
    return short if width is None else cut_middle(short, width)


def readable_all(names: list[str], width: int | None = None,
                 among: Iterable[str] = ()) -> list[str]:
    """`readable` of each of `names`; two kernels that read alike once shortened (the same
    op in two dtypes) are told apart, `… #2`, by the order of their whole names among
    `names` and `among` (the other tables that show them): one kernel reads the same in
    every table, whatever its rank in each."""
    label: dict[str, str] = {}  # whole name -> its label
    counts: dict[str, int] = {}
    for name in sorted({*names, *among}):
        short = readable(name, width)
        counts[short] = counts.get(short, 0) + 1
        label[name] = short if counts[short] == 1 else f"{short} #{counts[short]}"
    return [label[name] for name in names]
