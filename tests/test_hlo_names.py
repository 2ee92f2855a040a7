import pytest

from tpudiag.model.hlo_names import async_pair_key, async_role, collective_family, has_double_suffix


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


def test_async_pairing_keeps_every_suffix():
    assert async_role("all-gather-start.1.0") == ("start", "all-gather")
    assert async_pair_key("all-gather-start.1.0") == async_pair_key("all-gather-done.1.0") == "all-gather.1.0"
    assert async_pair_key("all-gather-start.1") != async_pair_key("all-gather-done.1.0")
    assert async_role("fusion.3") is None
    assert has_double_suffix("all-gather-start.1.0") and not has_double_suffix("all-gather-start.1")
