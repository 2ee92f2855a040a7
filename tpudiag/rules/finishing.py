"""What the engine does to every rule's findings once they are made, so each rule gets it for free.

- Repeats become one finding (`group_repeats`): ops of one instruction shape that a rule reports
  with one fix (an XLA clone `fusion.1` of `fusion`, the same layer's op in every layer) are one
  cause. They are grouped into one finding that names every op, sums their savings (the ops are
  disjoint, so their times add) and says how long they take together per step.
- Findings speak the user's language (`locate`): each op a finding names gets its source line and
  JAX op name (the op's metadata `source` and `tf_op`, from the trace, else from the compiled
  HLO's metadata) beside its HLO name, in the message and in its evidence row, and as
  `Finding.sites` for the renderers that want them apart.

Both read only what the rules read (the analysis and the compiled programs) and print nothing:
renderers escape the names, which come from the trace, as they escape every other name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pandas as pd

from tpudiag.analysis.profile_analysis import Analysis
from tpudiag.model.compiled import CompiledProgram
from tpudiag.model.findings import Evidence, Finding, OpSite, Saving, Severity
from tpudiag.model.units import fmt_pct, fmt_time
from tpudiag.rules.base import Rule, SeverityScale, op_events, per_step_worst_core, step_basis

# At most this many ops get their site written into a message: a finding that lists eight
# collectives would otherwise become a paragraph (every op's site is still in `sites` and evidence).
MAX_SITES_IN_MESSAGE = 3


def _op_rows(analysis: Analysis | None, names: set[str]) -> pd.DataFrame:
    if analysis is None or analysis.ops.empty or not names:
        return pd.DataFrame(columns=["name", "category", "shape_with_layout", "source", "tf_op", "self_time_ps"])
    ops = analysis.ops
    rows = ops[ops["name"].astype(str).isin(names)]
    return rows.assign(name=rows["name"].astype(str), category=rows["category"].astype(str))


def _instruction(programs: tuple[CompiledProgram, ...], name: str):
    """(program, instruction) of the op named `name`, at entry level or below it (a loop body),
    never inside a fusion (`entry_op_of` names the ops a timeline of entry ops times)."""
    for program in programs:
        inst = program.find(name) if name in program.entry_op_of else None
        if inst is not None:
            return program, inst
    return None, None


def _signature(name: str, rows: pd.DataFrame, programs: tuple[CompiledProgram, ...]) -> tuple | None:
    """What makes two ops the same instruction: category and result shape with layout (from the
    trace), and opcode and operand shapes (from the compiled program, when it has the op). None
    when neither knows the op: such ops are never grouped."""
    mine = rows[rows["name"] == name]
    traced = (str(mine["category"].iloc[0]), str(mine["shape_with_layout"].iloc[0])) if not mine.empty else None
    program, inst = _instruction(programs, name)
    compiled = None
    if inst is not None:
        operands = tuple(program.instructions[(inst.computation, o)].shape_text
                         if (inst.computation, o) in program.instructions else "?" for o in inst.operands)
        compiled = (inst.opcode, inst.fusion_kind, inst.shape_text, operands)
    if traced is None and compiled is None:
        return None
    return traced, compiled


def group_repeats(findings: list[Finding], analysis: Analysis | None, programs: tuple[CompiledProgram, ...],
                  rules: dict[str, tuple[Rule, object]] | None = None) -> list[Finding]:
    """One finding per (rule, host, fix, saving basis, instruction shape) among one-op findings.

    A group of one is left as it was. The group's finding keeps its largest member's message and
    adds the other ops and the time they take together; evidence rows are every member's. Its
    severity is the rule's own scale (`high_share`, `medium_share` in `rules[name]`'s options)
    applied to the summed saving, else the highest of its members'."""
    single = [f for f in findings if len(f.ops) == 1]
    rows = _op_rows(analysis, {f.ops[0] for f in single})
    groups: dict[tuple, list[Finding]] = {}
    out: list[Finding | tuple] = []
    for f in findings:
        signature = _signature(f.ops[0], rows, programs) if len(f.ops) == 1 else None
        if signature is None:
            out.append(f)
            continue
        key = (f.rule, f.host, f.fix, f.saving.basis, f.blocking, signature)
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append(f)
    return [_merge(groups[item], analysis, (rules or {}).get(item[0])) if isinstance(item, tuple) else item
            for item in out]


def _together(analysis: Analysis | None, names: list[str]) -> str:
    """`together 15.8 µs per step, 18.0% of device time`: the group's self time per step on the
    core where it takes longest, and its share of all cores' time."""
    if analysis is None or analysis.ops.empty:
        return ""
    basis = step_basis(analysis)
    per_step = per_step_worst_core(op_events(analysis, names), "self_ps", basis)
    ops = analysis.ops
    total_core_ps = sum(analysis.core_time_ps.values())
    share = float(ops.loc[ops["name"].astype(str).isin(names), "self_time_ps"].sum()) / total_core_ps \
        if total_core_ps else 0.0
    return f"together {fmt_time(per_step)} per step, {fmt_pct(share)} of device time"


def _severity(members: list[Finding], saving_ps: int, analysis: Analysis | None, rule) -> Severity:
    highest = max(f.severity for f in members)
    rule, options = rule if rule is not None else (None, None)
    high, medium = getattr(options, "high_share", None), getattr(options, "medium_share", None)
    step_ps = step_basis(analysis).step_ps if analysis is not None else 0.0
    if high is None or medium is None or not step_ps:
        return highest
    return max(highest, SeverityScale(high, medium).of(saving_ps / step_ps, rule.severity))


def _merge(members: list[Finding], analysis: Analysis | None, rule) -> Finding:
    if len(members) == 1:
        return members[0]
    members = sorted(members, key=lambda f: (-f.saving.ps, f.ops[0]))
    first, others = members[0], members[1:]
    names = [f.ops[0] for f in members]
    together = _together(analysis, names)
    listed = ", ".join(f"`{f.ops[0]}`" for f in others)
    message = (f"{first.message}; {len(others)} more op{'s' * (len(others) != 1)} of the same shape with the "
               f"same fix: {listed} ({len(members)} ops{', ' + together if together else ''})")
    saving = Saving(sum(f.saving.ps for f in members), first.saving.basis,
                    f"{first.saving.explanation}, summed over the {len(members)} ops of one shape")
    return dataclasses.replace(first, message=message, saving=saving,
                               severity=_severity(members, saving.ps, analysis, rule),
                               evidence=tuple(e for f in members for e in f.evidence), ops=tuple(names))


def _sites(analysis: Analysis | None, programs: tuple[CompiledProgram, ...], names: set[str]) -> dict[str, OpSite]:
    """Each op's source line and JAX op name: the trace's metadata, else the compiled program's."""
    sites: dict[str, OpSite] = {}
    rows = _op_rows(analysis, names)
    for name, source, tf_op in zip(rows["name"], rows["source"].fillna(""), rows["tf_op"].fillna("")):
        if (source or tf_op) and name not in sites:
            sites[name] = OpSite(name, str(source), str(tf_op))
    for name in names - set(sites):
        _, inst = _instruction(programs, name)
        if inst is not None and (inst.source_file or inst.op_name):
            source = f"{inst.source_file.rsplit('/', 1)[-1]}:{inst.source_line}" if inst.source_file else ""
            sites[name] = OpSite(name, source, inst.op_name)
    return sites


def _annotated(message: str, sites: Iterable[OpSite]) -> str:
    """The message with each named op's first backticked mention followed by where it comes from
    (once per place: clones of one line of the model are not told the same line again)."""
    written = set()
    for site in list(sites)[:MAX_SITES_IN_MESSAGE]:
        if site.label() in written:
            continue
        written.add(site.label())
        quoted = f"`{site.op}`"
        where = ", ".join(f"`{part}`" for part in (site.source, site.tf_op) if part)
        message = message.replace(quoted, f"{quoted} (at {where})", 1)
    return message


def _with_site(row: Evidence, site: OpSite) -> Evidence:
    """The evidence row with an `at` value, unless the rule already wrote the site's parts in it."""
    values = {v for _, v in row.values}
    if any(part in values for part in (site.source, site.tf_op) if part):
        return row
    return Evidence(row.subject, (*row.values, ("at", site.label())))


def locate(findings: list[Finding], analysis: Analysis | None,
           programs: tuple[CompiledProgram, ...]) -> list[Finding]:
    """Each finding with `sites` for its ops, and those sites in its message and evidence rows."""
    sites = _sites(analysis, programs, {op for f in findings for op in f.ops})
    out = []
    for f in findings:
        mine = tuple(sites[op] for op in f.ops if op in sites)
        if not mine:
            out.append(f)
            continue
        named = [s for s in mine if f"`{s.op}`" in f.message]
        own = {s.op: s for s in mine}
        evidence = tuple(_with_site(e, own[e.subject]) if e.subject in own else e for e in f.evidence)
        out.append(dataclasses.replace(f, message=_annotated(f.message, named), evidence=evidence, sites=mine))
    return out
