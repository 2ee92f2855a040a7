"""`load_llo_dump`: walk a `--xla_jf_dump_to` directory and parse what is there.

Missing files are normal (filters choose what libtpu writes), so each table is simply empty when
its source is absent. Unknown, damaged or truncated files become warnings on the result; only a
directory that cannot be read, or holds no dump file at all, is an `InputError`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tpudiag.errors import InputError
from tpudiag.model import llo
from tpudiag.model.llo import (BundleDma, BundleUtilization, DumpFile, LloCompile, LloDump, RegisterPressure,
                               ScheduleAnalysis, VmemReport)
from tpudiag.parsers.llo.bundle_profile import parse_bundle_profile
from tpudiag.parsers.llo.files import (PARSED_LABELS, STATIC_PROFILE_SUFFIX, classify, describe,
                                       group_compiles, is_known_label, read_text)
from tpudiag.parsers.llo.ops import build_ops
from tpudiag.parsers.llo.register_pressure import MAX_LIVE_RANGES, parse_register_pressure
from tpudiag.parsers.llo.schedule import parse_schedule
from tpudiag.parsers.llo.spills import RegionTree, count_dma, parse_final_bundles, parse_post_ra
from tpudiag.parsers.llo.static_profile import parse_static_profile
from tpudiag.parsers.llo.utilization import parse_utilization
from tpudiag.parsers.llo.vmem_report import parse_vmem_report

_HINT = ("compile with LIBTPU_INIT_ARGS='--xla_jf_dump_to=DIR --xla_jf_dump_llo_text=true' "
         "and pass DIR")
# Programs that are not HLO ops: spills there belong to no op unless post-ra names one.
_NON_OP_PROGRAMS = ("TLP",)


def _list_dir(path: Path) -> list[Path]:
    if not path.exists():
        raise InputError("no such directory", path=path, hint=_HINT)
    if not path.is_dir():
        raise InputError("not a directory (expected an LLO dump directory)", path=path, hint=_HINT)
    try:
        return sorted(p for p in path.iterdir())
    except OSError as exc:
        raise InputError(f"cannot list directory ({exc.strerror or exc})", path=path) from exc


def _static_files(entries: list[Path], extra: Path | None, warnings: list[str]) -> list[Path]:
    """Static-profile textprotos in the directory, its subdirectories and `extra`."""
    found: list[Path] = [p for p in entries if p.name.endswith(STATIC_PROFILE_SUFFIX)]
    if extra is not None and not extra.is_dir():
        warnings.append(f"`{extra}`: static profile directory not found; cycle estimates unknown")
        extra = None
    dirs = [p for p in entries if p.is_dir()] + ([extra] if extra is not None else [])
    for d in dirs:
        try:
            found += sorted(d.rglob(f"*{STATIC_PROFILE_SUFFIX}"))
        except OSError as exc:
            warnings.append(f"`{d}`: cannot list ({exc.strerror or exc}); its static profile skipped")
    return sorted(set(found))


def _select_compile(root: Path, files: list[DumpFile], module: str | None,
                    warnings: list[str]) -> tuple[LloCompile | None, tuple[LloCompile, ...], list[DumpFile]]:
    """The compile to read (`module`'s newest, else the newest), the others, and its files."""
    groups = group_compiles(files)
    described = [(describe(stamp, group), group) for stamp, group in groups]
    if module is not None:
        candidates = [(c, g) for c, g in described if c.module_name == module]
        if not candidates:
            names = sorted({c.module_name or "<unnamed>" for c, _ in described})
            raise InputError(f"no compile of module `{module}` in this dump", path=root,
                             hint=f"modules here: {', '.join(names)}")
    else:
        candidates = described
    chosen, chosen_files = candidates[-1]
    others = tuple(c for c, _ in described if c is not chosen)
    if others:
        names = ", ".join(f"`{c.module_name or '<unnamed>'}`" for c, _ in described)
        warnings.append(f"{len(described)} compiles in this directory ({names}); read "
                        f"`{chosen.module_name or '<unnamed>'}`, the newest"
                        + (" of that module" if module is not None else "; pass `module` to choose"))
    # Within one compile a (program, label) pair is unique; keep the newest should it repeat.
    unique: dict[tuple[str, str], DumpFile] = {}
    for f in sorted(chosen_files, key=lambda f: (f.timestamp_ns, f.index)):
        unique[(f.program, f.label)] = f
    ordered = sorted(unique.values(), key=lambda f: (f.timestamp_ns, f.program, f.index))
    return (chosen if groups[0][0] != 0 else None), others, ordered


def load_llo_dump(path: str | Path, *, module: str | None = None,
                  static_profile_dir: str | Path | None = None,
                  max_live_ranges: int = MAX_LIVE_RANGES) -> LloDump:
    """Parse an LLO dump directory (`--xla_jf_dump_to`) into an `LloDump`.

    A process appends every compile to the directory; one is read: the newest, or the newest of
    HLO module `module` (e.g. `jit_train_step`). Static-profile textprotos are looked for in the
    directory, its subdirectories and `static_profile_dir`
    (`--xla_jf_dump_static_llo_profile_to`, when it is elsewhere). They carry no timestamp, so
    with several compiles only those naming an op of the chosen compile are kept.
    """
    root = Path(path)
    try:
        return _load(root, module, static_profile_dir, max_live_ranges)
    except (OverflowError, RecursionError) as exc:
        # Numbers past int64 (a 20-digit cycle count) or absurd nesting that the per-table
        # checks did not catch: the dump is damaged; say so rather than show a traceback.
        cause = "a number beyond int64" if isinstance(exc, OverflowError) else "nesting too deep"
        raise InputError(f"damaged LLO dump: {cause}", path=root) from exc


def _load(root: Path, module: str | None, static_profile_dir: str | Path | None, max_live_ranges: int) -> LloDump:
    warnings: list[str] = []
    entries = _list_dir(root)
    static_paths = _static_files(entries, None if static_profile_dir is None else Path(static_profile_dir),
                                 warnings)
    classified, unknown_names, unknown_labels = [], [], defaultdict(int)
    for p in entries:
        if p.is_dir() or p.name.endswith(STATIC_PROFILE_SUFFIX):
            continue
        f = classify(p)
        if f is None:
            unknown_names.append(p.name)
        elif not is_known_label(f.label):
            unknown_labels[f.label] += 1
        else:
            classified.append(f)
    if not classified and not static_paths:
        raise InputError("no LLO dump files here", path=root, hint=_HINT)
    if unknown_names:
        shown = ", ".join(f"`{n}`" for n in unknown_names[:5]) + (" ..." if len(unknown_names) > 5 else "")
        warnings.append(f"{len(unknown_names)} file(s) not named like jf dump files, ignored: {shown}")
    if unknown_labels:
        labels = sorted(unknown_labels)
        warnings.append(f"{sum(unknown_labels.values())} file(s) with pass labels not parsed: "
                        + ", ".join(labels[:8]) + (" ..." if len(labels) > 8 else ""))
    compile_, others, files = _select_compile(root, classified, module, warnings)

    parsed = _Parsed()
    for f in files:
        if f.label in PARSED_LABELS:
            text = read_text(Path(f.path), warnings)
            if text is not None:
                parsed.add(f, text, warnings, max_live_ranges)
    static_rows = []
    for p in static_paths:
        text = read_text(p, warnings)
        if text is not None:
            static_rows += parse_static_profile(text, p.name, warnings)
    if others:
        known = {r["hlo"] for r in parsed.profile_rows} | {f.program for f in files}
        static_rows = [r for r in static_rows if r["hlo"] in known]
    _check_static_duplicates(static_rows, warnings)
    _resolve_hlos(parsed.spill_rows, parsed.slot_rows, parsed.trees)
    return _assemble(root, files, parsed, static_rows, compile_, others, warnings)


@dataclass
class _Parsed:
    """Rows and facts gathered from a compile's files, before they become tables."""

    profile_rows: list[dict] = field(default_factory=list)
    schedule_rows: list[dict] = field(default_factory=list)
    spill_rows: list[dict] = field(default_factory=list)
    slot_rows: list[dict] = field(default_factory=list)
    vmem_rows: list[dict] = field(default_factory=list)
    utilization: list[BundleUtilization] = field(default_factory=list)
    schedules: list[ScheduleAnalysis] = field(default_factory=list)
    pressure: list[RegisterPressure] = field(default_factory=list)
    trees: dict[str, RegionTree] = field(default_factory=dict)
    dma: list[BundleDma] = field(default_factory=list)
    vmem_report: VmemReport | None = None
    vmem_report_seen: bool = False

    def add(self, f: DumpFile, text: str, warnings: list[str], max_live_ranges: int) -> None:
        name = Path(f.path).name
        if f.label == "hlo-static-bundle-profile":
            self.profile_rows += parse_bundle_profile(text, f.program, name, warnings)
        elif f.label == "final_hlo-static-per-bundle-utilization":
            u = parse_utilization(text, f.program, name, warnings)
            if u is not None:
                self.utilization.append(u)
        elif f.label == "schedule-analysis_final_bundles":
            s, rows = parse_schedule(text, f.program, name, warnings)
            self.schedule_rows += rows
            if s is not None:
                self.schedules.append(s)
        elif f.label == "register-pressure":
            self.pressure += parse_register_pressure(text, f.program, name, warnings, max_live_ranges)
        elif f.label == "final_bundles":
            self.spill_rows += parse_final_bundles(text, f.program, name, warnings)
            self.dma.append(count_dma(text, f.program))
        elif f.label == "post-ra":
            self.trees[f.program], rows = parse_post_ra(text, f.program)
            self.slot_rows += rows
        elif f.label == "vmem_report" and not self.vmem_report_seen:  # one per compile (TLP)
            self.vmem_report_seen = True
            self.vmem_report, self.vmem_rows = parse_vmem_report(text, name, warnings)


def _assemble(root: Path, files: list[DumpFile], parsed: _Parsed, static_rows: list[dict],
              compile_: LloCompile | None, others: tuple[LloCompile, ...], warnings: list[str]) -> LloDump:
    def table(schema: llo.LloTableSchema, rows: list[dict]):
        return schema.frame({name: [r[name] for r in rows] for name in schema.names})

    parsed.profile_rows = _drop_overflowing(parsed.profile_rows, "bundle profile", warnings)
    static_rows = _drop_overflowing(static_rows, "static profile", warnings)
    parsed.spill_rows = _drop_overflowing(parsed.spill_rows, "spill", warnings)
    parsed.slot_rows = _drop_overflowing(parsed.slot_rows, "spill slot", warnings)
    parsed.schedule_rows = _drop_overflowing(parsed.schedule_rows, "schedule", warnings)
    parsed.vmem_rows = _drop_overflowing(parsed.vmem_rows, "VMEM allocation", warnings)

    bundle_profile = table(llo.BUNDLE_PROFILE, parsed.profile_rows)
    static_profile = table(llo.STATIC_PROFILE, static_rows)
    spills = table(llo.SPILL_INSTRUCTIONS, parsed.spill_rows)
    slots = table(llo.SPILL_SLOTS, parsed.slot_rows)
    schedule = table(llo.SCHEDULE, parsed.schedule_rows)
    vmem = table(llo.VMEM_ALLOCATIONS, parsed.vmem_rows)
    labels = {(f.program, f.label) for f in files}
    ops = build_ops(programs={f.program for f in files}, bundle_profile=bundle_profile,
                    static_profile=static_profile, spill_instructions=spills, spill_slots=slots,
                    slot_programs={p for p, label in labels if label == "post-ra"},
                    bundle_programs={p for p, label in labels if label == "final_bundles"},
                    schedule=schedule, vmem_allocations=vmem, has_vmem_report=parsed.vmem_report is not None,
                    utilization=tuple(parsed.utilization), schedules=tuple(parsed.schedules),
                    register_pressure=tuple(parsed.pressure))
    return LloDump(path=str(root), files=tuple(files), ops=ops, bundle_profile=bundle_profile,
                   static_profile=static_profile, spill_instructions=spills, spill_slots=slots,
                   schedule=schedule, vmem_allocations=vmem, utilization=tuple(parsed.utilization),
                   schedules=tuple(parsed.schedules), register_pressure=tuple(parsed.pressure),
                   bundle_dma=tuple(parsed.dma), vmem_report=parsed.vmem_report, compile=compile_, other_compiles=others,
                   warnings=list(dict.fromkeys(warnings)))


_INT64 = (-(1 << 63), (1 << 63) - 1)


def _drop_overflowing(rows: list[dict], what: str, warnings: list[str]) -> list[dict]:
    """Rows whose whole numbers fit the tables' int64 columns; the others dropped with a warning.

    A 20-digit cycle count or size is damage (no compile counts past 2^63), and numpy cannot store it.
    """
    def fits(row: dict) -> bool:
        return all(_INT64[0] <= v <= _INT64[1] for v in row.values() if isinstance(v, int))

    kept = [r for r in rows if fits(r)]
    if len(kept) < len(rows):
        warnings.append(f"{len(rows) - len(kept)} {what} row(s) with numbers beyond int64 dropped (damaged dump)")
    return kept


def _resolve_hlos(spill_rows: list[dict], slot_rows: list[dict], trees: dict[str, RegionTree]) -> None:
    """Name each spill's HLO op: the post-ra region's `#{op}`, else the program (one op per program)."""
    for row in spill_rows:
        tree = trees.get(row["program"])
        if tree is not None:
            row["region"] = tree.spill_region.get(row["instruction"])
            row["in_loop"] = tree.in_loop(row["region"])
    for row in (*spill_rows, *slot_rows):
        tree = trees.get(row["program"])
        hlo = tree.hlo_of(row["region"]) if tree is not None and row.get("hlo") is None else row.get("hlo")
        if hlo is None:
            hlo = "" if row["program"] in _NON_OP_PROGRAMS or row["program"].startswith("<") else row["program"]
        row["hlo"] = hlo


def _check_static_duplicates(rows: list[dict], warnings: list[str]) -> None:
    seen: dict[str, int] = defaultdict(int)
    for r in rows:
        seen[r["hlo"]] += 1
    dup = sorted(n for n, k in seen.items() if k > 1)
    if dup:
        warnings.append(f"static profile: several estimates for {dup[:5]}; all kept in the table, "
                        "the ops table uses the last")
