"""`model.hardware`'s functions on literal cases: which chip a name means (trace strings, JAX's
device_kind), the chip a diagnosis decides and its warnings word for word, and a GPU from its
plane's stats (xprof's stat names, `device_caps_utils.cc`; peaks as the module's table states them)."""

from __future__ import annotations

import pytest

from tpudiag.model.hardware import (GIB, ChipSource, _stat_int, amd_hbm_peak, chip_for, decide_chip, gpu_device,
                                    smallest_topology)


@pytest.mark.parametrize(("name", "generation"), [
    ("v6e", "v6e"), ("V5E", "v5e"), (" v5p ", "v5p"), ("tpu7x", "TPU7x"),
    ("TPU v6 Lite", "v6e"), ("TPU v5 lite", "v5e"), ("TPU v5", "v5p"), ("TPU v5p", "v5p"), ("TPU v4", "v4"),
    ("TPU v5litepod-8", "v5e"), ("Ironwood", "TPU7x"), ("TPU v7", "TPU7x"),
    ("", None), (None, None), ("TPU v9", None), ("gpu", None)])
def test_chip_for(name, generation):
    chip = chip_for(name)
    assert (chip.generation if chip else None) == generation


@pytest.mark.parametrize(("generation", "topology"), [("v5e", "v5e:2x2"), ("v6e", "v6e:2x2"), ("v4", "v4:2x2x1"),
                                                      ("v5p", "v5p:2x2x1"), ("TPU7x", "TPU7x:2x2x1")])
def test_smallest_topology(generation, topology):
    assert smallest_topology(chip_for(generation)) == topology


def test_the_trace_wins_and_a_different_user_chip_is_ignored_with_a_warning():
    choice = decide_chip(trace=chip_for("v6e"), target="v5e", llo="v5p", user=chip_for("v4"), what="capture")
    assert (choice.spec.generation, choice.source) == ("v6e", ChipSource.TRACE)
    assert choice.warnings == ("--chip v4 ignored: the capture ran on v6e",)
    same = decide_chip(trace=chip_for("v6e"), user=chip_for("v6e"))
    assert (same.spec.generation, same.source, same.warnings) == ("v6e", ChipSource.TRACE, ())


def test_the_dumps_target_then_the_llo_dump():
    choice = decide_chip(target="v5e", llo="v5p", user=chip_for("v6e"))
    assert (choice.spec.generation, choice.source) == ("v5e", ChipSource.DUMP)
    assert choice.warnings == ("--chip v6e ignored: the dump was compiled for v5e",)
    llo = decide_chip(llo="v5p")
    assert (llo.spec.generation, llo.source) == ("v5p", ChipSource.LLO)
    assert llo.warnings == ("TPU generation v5p inferred from the LLO dump (MXUs per core and VMEM capacity): "
                            "no `target_arguments.txt` here",)


def test_the_user_fills_in_and_nothing_is_unknown():
    choice = decide_chip(user=chip_for("v5e"), what="capture")
    assert (choice.spec.generation, choice.source) == ("v5e", ChipSource.USER)
    assert choice.warnings == ("TPU generation v5e from --chip: the capture does not name it",)
    none = decide_chip()
    assert (none.spec, none.source, none.warnings) == (None, ChipSource.UNKNOWN, ())


@pytest.mark.parametrize(("value", "read"), [(5, 5), (5.9, 5), (0, 0), (-1, 0), (True, 0), ("7", 0),
                                             (float("nan"), 0), (None, 0)])
def test_stat_int(value, read):
    assert _stat_int({"k": value} if value is not None else {}, "k") == read


# An H100 plane: vendor, compute capability 9.0, 132 SMs at 1,830,000 kHz, 3.35 TB/s, 80 GiB.
H100 = {"device_vendor": "Nvidia", "compute_cap_major": 9, "compute_cap_minor": 0, "core_count": 132,
        "clock_rate": 1_830_000, "memory_bandwidth": 3.35e12, "memory_size": 80 * GIB}


def test_an_nvidia_plane():
    gpu = gpu_device(H100)
    assert (gpu.vendor, gpu.compute_capability, gpu.cores, gpu.clock_hz) == ("NVIDIA", (9, 0), 132, 1.83e9)
    assert (gpu.hbm_bytes_per_s, gpu.plane_hbm_bytes_per_s, gpu.memory_bytes) == (3.35e12, 3.35e12, 80 * GIB)
    assert gpu.generation.arch == "Hopper"
    assert gpu.peak_flops_per_s == 4096 * 132 * 1.83e9  # ~989 TFLOP/s, the datasheet's dense bf16
    assert gpu.describe() == "NVIDIA H100/H200 (Hopper, compute capability 9.0), 132 SMs at 1.83 GHz, 80 GiB"
    assert gpu.peaks_source() == ("FLOP/s: the generation's dense bf16 matrix rate x SMs x clock; HBM: the plane's "
                                  "memory_bandwidth stat")


def test_a_v100s_peak_is_its_fp16_tensor_rate_it_has_no_bf16():
    # NVIDIA's V100 whitepaper: 125 TFLOP/s of fp16 tensor math, 80 SMs at 1.53 GHz; Volta's tensor
    # cores take no bf16 (Ampere's are the first that do), so the source must not say bf16.
    v100 = {"compute_cap_major": 7, "compute_cap_minor": 0, "core_count": 80, "clock_rate": 1_530_000,
            "memory_bandwidth": 898e9, "memory_size": 16 * GIB}
    gpu = gpu_device(v100)
    assert gpu.peak_flops_per_s == pytest.approx(125e12, rel=0.003)
    assert gpu.peaks_source().startswith("FLOP/s: the generation's dense fp16 matrix rate x SMs x clock")


def test_an_older_capture_without_a_vendor_is_nvidia_and_a_name_in_the_trace_heads_it():
    stats = {k: v for k, v in H100.items() if k != "device_vendor"} | {"gpu_device_name": "NVIDIA H100 80GB HBM3"}
    gpu = gpu_device(stats)
    assert gpu.vendor == "NVIDIA" and gpu.name_in_trace == "NVIDIA H100 80GB HBM3"
    assert gpu.describe() == "NVIDIA H100 80GB HBM3, 132 SMs at 1.83 GHz, 80 GiB"


def test_an_amd_plane_takes_the_datasheets_hbm():
    # MI300X: gfx 9.4, 304 CUs at 2.1 GHz, 192 GiB; its plane says 2.66 TB/s, AMD's datasheet 5.3 TB/s
    stats = {"device_vendor": "AMD", "compute_cap_major": 9, "compute_cap_minor": 4, "core_count": 304,
             "clock_rate": 2_100_000, "memory_bandwidth": 2.66e12, "memory_size": 192 * GIB}
    gpu = gpu_device(stats)
    assert (gpu.hbm_bytes_per_s, gpu.plane_hbm_bytes_per_s) == (5.3e12, 2.66e12)
    assert gpu.peak_flops_per_s == 2048 * 304 * 2.1e9
    assert gpu.describe() == "AMD Instinct MI300 (gfx942), 304 CUs at 2.10 GHz, 192 GiB"
    assert gpu.peaks_source() == ("FLOP/s: the generation's dense bf16 matrix rate x CUs x clock; HBM from AMD's "
                                  "MI300X datasheet (the plane records 2.66 TB/s, counting HBM3 at two transfers per "
                                  "clock)")
    assert amd_hbm_peak(gpu.generation, 256 * GIB).models == "MI325X"
    assert amd_hbm_peak(gpu.generation, 100 * GIB) is None and amd_hbm_peak(gpu.generation, 0) is None
    assert amd_hbm_peak(gpu_device(H100).generation, 192 * GIB) is None and amd_hbm_peak(None, 192 * GIB) is None


def test_an_unknown_generation_has_no_peak_and_says_what_it_knows():
    gpu = gpu_device({"device_vendor": "AMD", "compute_cap_major": 11, "compute_cap_minor": 0, "core_count": 96})
    assert gpu.generation is None and gpu.peak_flops_per_s is None
    assert gpu.describe() == "AMD gfx110, 96 CUs"
    nv = gpu_device({"compute_cap_major": 12, "compute_cap_minor": 1})
    assert nv.describe() == "NVIDIA compute capability 12.1"
    bare = gpu_device({})
    assert (bare.vendor, bare.compute_capability, bare.describe(), bare.peak_flops_per_s) == ("", None, "GPU", None)
    assert gpu_device({"device_vendor": "Intel"}).describe() == "Intel GPU"
    no_clock = gpu_device({k: v for k, v in H100.items() if k != "clock_rate"})
    assert no_clock.peak_flops_per_s is None and no_clock.describe().endswith("132 SMs, 80 GiB")


def test_a_vendor_in_lower_case_and_the_peaks_source_of_an_unknown_generation():
    assert gpu_device({"device_vendor": "amd"}).vendor == "AMD"
    assert "dense bf16 matrix rate" in gpu_device({}).peaks_source()
