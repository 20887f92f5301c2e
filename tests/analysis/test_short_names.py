"""Readable kernel names in the text and HTML reports (the JSON keeps them whole)."""

from __future__ import annotations

import pytest

from chiptrace.analysis.short_names import ELLIPSIS, short_name, shorten_in

FILL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, "
    "at::detail::Array<char*, 1>)"
)


@pytest.mark.parametrize(
    ("name", "short"),
    [
        (FILL, "at::native::vectorized_elementwise_kernel<4, FillFunctor, Array>(…)"),
        (
            "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
            "ncclKernel_AllReduce_RING_LL_Sum_float(…)",
        ),
        (
            "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 1, "
            "128, 1>(float*)",
            "at::native::CatArrayBatchedCopy<float, unsigned int, 1, 128, 1>(…)",
        ),
        ("Memcpy HtoD (Pinned -> Device)", "Memcpy HtoD (Pinned -> Device)"),
        ("aten::mm", "aten::mm"),
        ("a<b", "a<b"),  # unbalanced: left alone
        (None, "-"),
    ],
)
def test_short_name(name, short):
    assert short_name(name) == short


def test_long_names_lose_arguments_then_namespaces_then_their_middle():
    cta = "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1"
    name = cta + "<c10::Half, float, c10::Half, 2ul, 32>(at::GenericPackedTensorAccessor<float>)"
    assert short_name(name, 90) == cta[5:] + "<…>(…)"
    short = short_name(name, 50)
    assert len(short) == 50 and ELLIPSIS in short and short.endswith("cta_per_row_1<…>(…)")
    assert short_name("x" * 100, 40) == "x" * 15 + ELLIPSIS + "x" * 24


def test_shorten_in_a_sentence():
    text = f"{FILL} dominates gpu time"
    assert shorten_in(text) == (
        "at::native::vectorized_elementwise_kernel<4, FillFunctor, Array>(…) dominates gpu time"
    )
    assert shorten_in("start f(a) per bucket") == "start f(a) per bucket"
