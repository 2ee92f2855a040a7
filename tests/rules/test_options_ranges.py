"""Every rule's `Options`: each range's edges, accepted and refused, with the whole message.

A literal table: the ranges are the ones the options' documentation states (a share in [0, 1) or
(0, 1], a count of at least 1). Milliseconds, no capture.
"""

from __future__ import annotations

import pytest

from tpudiag.rules import (device_idle, exposed_collective, hbm_pressure, host_transfer_bound, low_mxu_utilization,
                           memory_bound, padding_waste, spill, step_time_variance, straggler_core, straggler_host,
                           vmem_pressure)

REFUSED = [  # (module, option, value, message)
    (padding_waste, "min_padding_fraction", 1.0, "min_padding_fraction must be in [0, 1), got 1.0"),
    (padding_waste, "min_padding_fraction", -0.01, "min_padding_fraction must be in [0, 1), got -0.01"),
    (padding_waste, "max_findings", 0, "max_findings must be at least 1, got 0"),
    (low_mxu_utilization, "low_utilization", 0.0, "low_utilization must be in (0, 1], got 0.0"),
    (low_mxu_utilization, "low_utilization", 1.01, "low_utilization must be in (0, 1], got 1.01"),
    (low_mxu_utilization, "target_utilization", 1.01, "target_utilization must be in (0, 1], got 1.01"),
    (low_mxu_utilization, "target_utilization", 0.0, "target_utilization must be in (0, 1], got 0.0"),
    (low_mxu_utilization, "max_findings", 0, "max_findings must be at least 1, got 0"),
    (memory_bound, "near_roof", 0.0, "near_roof must be in (0, 1], got 0.0"),
    (memory_bound, "near_roof", 1.01, "near_roof must be in (0, 1], got 1.01"),
    (memory_bound, "max_ops_shown", 0, "max_ops_shown must be at least 1, got 0"),
    (spill, "min_spills", 0, "min_spills must be at least 1, got 0"),
    (spill, "max_findings", 0, "max_findings must be at least 1, got 0"),
    (device_idle, "min_idle_share", 1.0, "min_idle_share must be in [0, 1), got 1.0"),
    (device_idle, "min_idle_share", -0.01, "min_idle_share must be in [0, 1), got -0.01"),
    (device_idle, "max_steps_shown", -1, "max_steps_shown must be at least 0, got -1"),
    (exposed_collective, "max_evidence_rows", 0, "max_evidence_rows must be at least 1, got 0"),
    (straggler_core, "max_ops_shown", 0, "max_ops_shown must be at least 1, got 0"),
    (straggler_core, "min_lag_fraction", 10.0, "min_lag_fraction must be in [0, 10), got 10.0"),
    (straggler_core, "min_lag_fraction", -0.01, "min_lag_fraction must be in [0, 10), got -0.01"),
    (straggler_core, "noise_sigmas", -0.1, "noise_sigmas must be at least 0, got -0.1"),
    (straggler_host, "min_op_ratio", 0.99, "min_op_ratio must be at least 1, got 0.99"),
    (host_transfer_bound, "min_share", 1.01, "min_share must be in [0, 1], got 1.01"),
    (host_transfer_bound, "min_share", -0.01, "min_share must be in [0, 1], got -0.01"),
    (host_transfer_bound, "max_ops_shown", 0, "max_ops_shown must be at least 1, got 0"),
    (hbm_pressure, "near_fraction", 0.0, "near_fraction must be in (0, 1], got 0.0"),
    (hbm_pressure, "near_fraction", 1.01, "near_fraction must be in (0, 1], got 1.01"),
    (hbm_pressure, "max_buffers", 0, "max_buffers must be at least 1, got 0"),
    (vmem_pressure, "near_fraction", 0.0, "near_fraction must be in (0, 1], got 0.0"),
    (vmem_pressure, "near_fraction", 1.01, "near_fraction must be in (0, 1], got 1.01"),
    (vmem_pressure, "max_findings", 0, "max_findings must be at least 1, got 0"),
    (step_time_variance, "outlier_factor", 1.0, "outlier_factor must be above 1, got 1.0"),
    (step_time_variance, "max_cv", 0.0, "max_cv must be above 0, got 0.0"),
    (step_time_variance, "min_steps", 1, "min_steps must be at least 2, got 1"),
]

ACCEPTED = [  # (module, option, value): the edge inside each range
    (padding_waste, "min_padding_fraction", 0.0), (padding_waste, "min_padding_fraction", 0.99),
    (padding_waste, "max_findings", 1),
    (low_mxu_utilization, "low_utilization", 1.0), (low_mxu_utilization, "target_utilization", 1.0),
    (low_mxu_utilization, "max_findings", 1),
    (memory_bound, "near_roof", 1.0), (memory_bound, "max_ops_shown", 1),
    (spill, "min_spills", 1), (spill, "max_findings", 1),
    (device_idle, "min_idle_share", 0.0), (device_idle, "min_idle_share", 0.99), (device_idle, "max_steps_shown", 0),
    (exposed_collective, "max_evidence_rows", 1),
    (straggler_core, "max_ops_shown", 1), (straggler_core, "min_lag_fraction", 0.0),
    (straggler_core, "min_lag_fraction", 9.99), (straggler_core, "noise_sigmas", 0.0),
    (straggler_host, "min_op_ratio", 1.0),
    (host_transfer_bound, "min_share", 0.0), (host_transfer_bound, "min_share", 1.0),
    (host_transfer_bound, "max_ops_shown", 1),
    (hbm_pressure, "near_fraction", 1.0), (hbm_pressure, "max_buffers", 1),
    (vmem_pressure, "near_fraction", 1.0), (vmem_pressure, "max_findings", 1),
    (step_time_variance, "outlier_factor", 1.01), (step_time_variance, "max_cv", 0.01),
    (step_time_variance, "min_steps", 2),
]


@pytest.mark.parametrize(("module", "option", "value", "message"), REFUSED,
                         ids=[f"{m.NAME}-{o}-{v}" for m, o, v, _ in REFUSED])
def test_out_of_range_options_are_refused_with_the_range(module, option, value, message):
    with pytest.raises(ValueError) as caught:
        module.Options(**{option: value})
    assert str(caught.value) == message


@pytest.mark.parametrize(("module", "option", "value"), ACCEPTED, ids=[f"{m.NAME}-{o}-{v}" for m, o, v in ACCEPTED])
def test_the_edges_inside_each_range_are_accepted(module, option, value):
    assert getattr(module.Options(**{option: value}), option) == value


def test_exposed_collective_thresholds_must_be_ordered():
    Options = exposed_collective.Options
    assert Options(exposed_threshold=0.0, hidden_threshold=1.0).thresholds.hidden == 1.0
    for exposed, hidden in ((0.5, 0.5), (-0.1, 0.9), (0.1, 1.01)):
        with pytest.raises(ValueError) as caught:
            Options(exposed_threshold=exposed, hidden_threshold=hidden)
        assert str(caught.value) == ("thresholds must satisfy 0 <= exposed_threshold < hidden_threshold <= 1, got "
                                     f"exposed_threshold={exposed}, hidden_threshold={hidden}")
