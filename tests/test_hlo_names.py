import pytest

from tpudiag.model.hlo_names import (async_pair_key, async_role, category_family, collective_family, has_double_suffix,
                                      name_family, pair_async, window_family)


@pytest.mark.parametrize("name, category, family", [
    ("all-gather-start.1", "", "all-gather"),
    ("all-gather-done.1.0", "", "all-gather"),
    ("all_gather.3", "", "all-gather"),  # v6e spelling
    ("all-reduce-scatter.2", "all-reduce-scatter fusion", "reduce-scatter"),
    ("all-reduce.4", "all-reduce", "all-reduce"),
    ("async-collective-start.3", "", "collective"),
    ("all-gather.25.cloned.1.call-start", "", "all-gather"),
    ("psum.7", "all-reduce", "all-reduce"),  # shard_map names: only the category tells
    ("fusion.12", "convolution fusion", ""),
    ("async_collective_fusion.75", "", ""),  # compute carrying a collective step is compute
    ("send.1", "", "send"),
    ("sender_fusion", "", ""),  # near miss: not a send
])
def test_collective_family(name, category, family):
    assert collective_family(name, category) == family


@pytest.mark.parametrize("name, category, by_name, by_category", [
    ("all-gather-start.1", "convolution fusion", "all-gather", ""),  # the name decides
    ("async-collective-fusion.3", "all-gather fusion", "", "all-gather"),  # never a collective, whatever its category
    ("psum.7", "all-reduce", None, "all-reduce"),  # the name says nothing: the category decides
    ("fusion.12", "convolution fusion", None, ""),
    ("send.1", "send", "send", ""),  # only the first seven families are read from a category
])
def test_a_name_decides_its_family_or_leaves_it_to_the_category(name, category, by_name, by_category):
    # `steps._collective_events` classifies each name and each category once, not every pair.
    assert (name_family(name), category_family(category)) == (by_name, by_category)
    assert collective_family(name, category) == (by_name if by_name is not None else by_category)


def test_async_pairing_keeps_every_suffix():
    assert async_role("all-gather-start.1.0") == ("start", "all-gather")
    assert async_pair_key("all-gather-start.1.0") == async_pair_key("all-gather-done.1.0") == "all-gather.1.0"
    assert async_pair_key("all-gather-start.1") != async_pair_key("all-gather-done.1.0")
    assert async_role("fusion.3") is None
    assert has_double_suffix("all-gather-start.1.0") and not has_double_suffix("all-gather-start.1")


def test_pair_async_pairs_each_start_with_the_next_done_of_its_key():
    names = ["all-gather-start.1", "copy-start.2", "fusion.3", "all-gather-start.1", "all-gather-done.1",
             "copy-done.2", "all-gather-done.1", "all-gather-done.1.0"]
    assert pair_async(names) == [(0, 4), (1, 5), (3, 6)]  # the unmatched `.1.0` done pairs with nothing


@pytest.mark.parametrize("name, family", [("all-gather-start.1", "all-gather"), ("copy-start.3", "copy"),
                                          ("slice-start.2", "other")])
def test_window_family(name, family):
    assert window_family(name) == family


def test_io_categories_in_any_case():
    from tpudiag.model.hlo_names import is_io
    assert is_io("infeed") and is_io("Outfeed") and is_io("host send-done") and is_io("HOST RECV")
    assert not is_io("host send fusion") and not is_io("copy-start") and not is_io("")


def test_a_collective_librarys_own_kernels():
    from tpudiag.model.hlo_names import library_collective
    assert library_collective("ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    assert library_collective("ncclKernel_AllReduce_RING_LL_Sum_float")  # older NCCL
    assert library_collective("void rcclDevKernel_Generic(ncclDevComm*)")  # RCCL
    assert not library_collective("my_ncclDevKernel_AllGather")  # inside another word: not the library's
    assert not library_collective("all-reduce.3")  # an HLO collective, not a library kernel


def test_pairs_close_in_any_order_and_a_name_without_suffix_keys_by_its_base():
    # The copy started second finishes first: each done still pairs with its own start
    assert pair_async(["all-gather-start.1", "copy-start.2", "copy-done.2", "all-gather-done.1"]) == [(1, 2), (0, 3)]
    assert async_pair_key("copy-start") == async_pair_key("copy-done") == "copy"
    assert pair_async(["copy-start", "all-gather-start", "all-gather-done", "copy-done"]) == [(1, 2), (0, 3)]
