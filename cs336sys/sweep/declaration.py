"""What an experiment declares about itself, once: its kind, its Spec, its run, its metrics
and the table that shows its points.

Everything else is derived from the declaration:

- the SQL view (store/views.py): one column per setting of the Spec and per metric;
- the command's printed table and the report's main table (report/tables.py): `tables`;
- `report --compare` (report/compare.py): the `compare` metric and its min/max;
- the sweep runner's skip-after-OOM (sweep/runner.py): `oom_axis`.

Naming rule for metrics: a statistic over timed steps is `<name>_<stat>` with stat one of
mean, std, min, median, max, always (`step_ms_mean`, never a bare `step_ms` for a mean);
`timing()` declares the five at once. A metric that is one reading is a bare name
(`peak_bytes`). A renamed metric's column also reads rows stored under its old name
(`renamed`, docs/store.md "Renamed columns").

The declarations live with their experiments (experiments/<kind>.py) and are listed in
experiments/catalog.py. The store and the report sit below experiments/ and never import
it: whoever calls them (the CLI, a notebook) passes the declarations down. No torch here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, get_args, get_type_hints

from cs336sys.measure.stats import STATS
from cs336sys.sweep.points import is_setting


@dataclass(frozen=True)
class Metric:
    """One measured or derived value of a point: its column name, unit and meaning."""

    name: str
    unit: str  # "ms", "bytes", "TFLOP/s", "" for counts and labels
    meaning: str  # one line, for the docs and `--help` readers


def metric_table(rows: str) -> tuple[Metric, ...]:
    """Metrics declared as a table, one row each: the name, the unit (`-` for none) and the
    meaning, apart by spaces; a line indented deeper than the rows continues the meaning
    above it. The rows read as the docs' tables of them do."""
    import textwrap

    table: list[list[str]] = []
    for line in textwrap.dedent(rows).strip("\n").splitlines():
        if not line.strip():
            continue
        if line[0].isspace():
            if not table:
                raise ValueError(f"metric_table: a continuation before any row: {line!r}")
            table[-1][2] += " " + line.strip()
            continue
        parts = line.split(None, 2)
        if len(parts) != 3:
            raise ValueError(f"metric_table: expected name, unit and meaning: {line!r}")
        table.append([parts[0], "" if parts[1] == "-" else parts[1], parts[2]])
    return tuple(Metric(*row) for row in table)


def timing(base: str, meaning: str, unit: str = "ms") -> tuple[Metric, ...]:
    """The statistics of one timed quantity: `<base>_mean`, `_std`, `_min`, ..., `_n` (how
    many samples were taken) and `_drift` (measure/sampling.py)."""
    said = {"n": ("", f"{meaning}: how many timed samples were taken"),
            "drift": ("", f"{meaning}: median of the last third of the samples over the first "
                          "third's, minus 1")}
    return tuple(Metric(f"{base}_{s}", *said.get(s, (unit, f"{meaning}, {s} of the timed samples")))
                 for s in STATS)


def launch(phases: tuple[str, ...]) -> tuple[Metric, ...]:
    """The host-time metrics of timed phases (measure/timing.py, launch-bound)."""
    return (
        *(Metric(f"{p}_host_ms_mean", "ms", f"host time of the {p} phase until its calls "
                 "returned, before the sync, mean") for p in phases),
        Metric("launch_bound", "", "CUDA: some phase's host time was at least 90 % of its "
               "wall time (None elsewhere)"),
        Metric("launch_bound_phases", "", "CUDA: the launch-bound phases, e.g. fwd,bwd"),
    )


@dataclass(frozen=True)
class Column:
    """A column of a point table. The cell is the row's `key` (a setting or metric), or
    `cell(row)`, formatted as `fmt`; `ratio` makes it a relative column.

    fmt: text (the value as is), num (3 significant figures), exact (the shortest text that
    reads back as the same float), mean_std (`key` is a timed base: `<key>_mean ± <key>_std`),
    mib (bytes in MiB), pct (a fraction as %), sci (1.2e-05), size (bytes with a unit),
    yes_no. Metric cells of a point that did not finish say OOM, error or skipped instead.
    """

    header: str
    key: str | None = None
    fmt: str = "text"
    cell: Callable[[Mapping[str, Any]], str] | None = None
    setting: bool = False  # shows the point's identity (never replaced by OOM/error)
    ratio: Ratio | None = None
    covers: tuple[str, ...] = ()  # further settings this column shows (a label of several)
    optional: bool = False  # left out of a table where no row has a value for it
    note: str = ""  # added to the table's note where the column is shown
    # (word, sentence): the sentence joins the note only where a shown cell has the word
    notes_if: tuple[tuple[str, str], ...] = ()
    # its cell, where it has one, says the row's figures do not hold (attention's
    # `impossible`): a table that leaves the column out marks the row's cells instead
    flag: bool = False
    # a figure computed before the point ran (an accounting, an estimate): shown whatever
    # the point's status, where a measured one reads OOM
    before_run: bool = False


# The commands of two words -> the experiment kind whose rows each stores; any other command
# stores rows of the kind it is named after (`cs336sys attention`: attention).
SUBCOMMANDS = {
    ("memory", "residuals"): "memory-residuals",
    ("profile", "model"): "profile",
    ("profile", "attention"): "profile",
    ("precision", "accumulate"): "precision",
    ("precision", "autocast"): "precision",
}


def experiment_of(command: str) -> str:
    """The experiment kind the command (`memory residuals`, `model --size tiny`) stores."""
    words = command.split()
    return SUBCOMMANDS.get(tuple(words[:2]), words[0] if words else "")


def model_size(row: Mapping[str, Any]) -> str:
    """A size preset's name with its shape, d_model × layers and the parameters where known:
    `xl (2560×32, 3.4B)`. One name has meant two models (the 2025 and 2026 handouts' xl);
    the shape tells their rows apart. A point of one block (`memory residuals`) has no
    layers: `small (d_model 768)`."""
    size, d_model, layers, params = (row.get(k) for k in ("size", "d_model", "num_layers", "params"))
    if size is None or d_model is None:
        return "" if size is None else str(size)
    shape = f"{d_model}×{layers}" if layers is not None else f"d_model {d_model}"
    if isinstance(params, (int, float)) and not isinstance(params, bool) and params > 0:
        shape += ", " + (f"{params / 1e9:.1f}B" if params >= 1e9 else
                         f"{params / 1e6:.0f}M" if params >= 1e6 else f"{params / 1e3:.0f}k")
    return f"{size} ({shape})"


# Column.fmt's values (report/tables.py formats each)
FORMATS = ("text", "num", "exact", "mean_std", "mib", "pct", "sci", "size", "yes_no")


def column_table(rows: str) -> tuple[Column, ...]:
    """Columns declared as a table, one row each: the header (words), the key and the format
    (`Column.fmt`), then `optional` for a column left out of a table where no row has a value
    for it. `step ms  step_ms  mean_std` is the column headed "step ms" that shows the row's
    step_ms as mean ± std. The rows read as the printed table's columns do."""
    columns = []
    for line in rows.strip("\n").splitlines():
        words = line.split()
        if not words:
            continue
        optional = words[-1] == "optional"
        words = words[:-1] if optional else words
        if len(words) < 3 or words[-1] not in FORMATS:
            raise ValueError(f"column_table: expected a header, a key and a format of "
                             f"{', '.join(FORMATS)}: {line.strip()!r}")
        columns.append(Column(" ".join(words[:-2]), words[-2], words[-1], optional=optional))
    return tuple(columns)


SIZE_COLUMN = Column("size", "size", cell=model_size, setting=True, covers=("d_model", "num_layers"))
def model_name(model: str | None) -> str:
    """Whose model ran: the user's as --model named it, or (unset) cs336sys's."""
    return model or "cs336sys's"


# Whose model ran (--model): shown where a row ran the user's, cs336sys's named beside it
MODEL_COLUMN = Column("model", "model", cell=lambda r: model_name(r.get("model")),
                      setting=True, optional=True)


def setting_columns(names: str) -> tuple[Column, ...]:
    """Columns that show settings as they are, from a line of their keys: `"size seq
    ckpt=checkpoint"` is the columns size, seq and ckpt (the setting `checkpoint`). `size` is
    the model's size with its shape (`model_size`)."""
    pairs = [name.partition("=") for name in names.split()]
    return tuple(SIZE_COLUMN if (header, key) == ("size", "") else
                 Column(header, key or header, setting=True) for header, _, key in pairs)


@dataclass(frozen=True)
class Ratio:
    """`metric` of a row against the same point of the baseline (`against`): baseline / row
    when `speedup` (2.00x = twice as fast), else row / baseline. Rows are the same point when
    all settings but `vary` (and the device) are equal."""

    metric: Callable[[Mapping[str, Any]], float | None]
    against: Mapping[str, Any]
    vary: tuple[str, ...]
    speedup: bool = True
    # the raw samples behind `metric` (their key in the run's samples): the cell then gives
    # the ratio's 95 % bootstrap interval and says faster or slower only when it excludes 1
    # (measure/sampling.py)
    samples: str | None = None
    # (baseline row, row) -> why the row's difference cannot be (a saving larger than the
    # phase it acts on), or None
    impossible: Callable[[Mapping[str, Any], Mapping[str, Any]], str | None] | None = None


@dataclass(frozen=True)
class Table:
    """A table of points: the rows whose settings match `where`, with these columns."""

    title: str
    columns: tuple[Column, ...]
    where: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True, kw_only=True)
class Command:
    """The command that runs a kind, declared with it: `cs336sys <kind>` (dashes for
    underscores), made by the CLI from this (cli/declared.py). Its summary, the line
    `cs336sys --help` lists, is the first paragraph of the kind module's docstring, read
    without importing the module (experiments/catalog.py, `summary`). Its options are the
    shared groups named in `groups` (the model's first), then the parameters of `options`
    (declared with sweep/options.py's `option` and `list_option`, named as the kind's
    `specs` names its keywords), then the store's; its body is the one call every measuring
    command makes, `run_experiment(EXPERIMENT, EXPERIMENT.specs, options)` (cli/common.py).
    Nothing here imports the kind, so a command another one reuses stays light to import."""

    options: Callable[..., None]  # a function whose parameters are the kind's own options
    help: str  # what its --help says below the summary: paragraphs, blank lines between
    examples: tuple[str, ...]  # whole command lines, as a user types them
    groups: tuple[str, ...] = ()  # shared option groups: model, estimate, nsys (cli/declared.py)
    drop: tuple[str, ...] = ()  # options of those groups it does not take
    run_options: tuple[str, ...] = ()  # its options that go to run_sweep, not to specs
    describe: Callable[[Any], str] | None = None  # a point in a few words (the progress bar)
    # lines printed after the tables, from the points' rows (settings and metrics)
    closing: Callable[[list[dict]], list[str]] | None = None
    ranks: bool = False  # its points start ranks (the oversubscription warning)
    # Where only some of its points start ranks (step --world-size): from the options as
    # given, whether these will, so that the fork server starts first (distributed kinds':
    # always); parallel/launcher.started_early.
    starts_ranks: Callable[[dict[str, Any]], bool] | None = None
    emulation: bool = True  # warn where the CPU only emulates 16-bit dtypes


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """An experiment kind, declared once (see the module docstring)."""

    kind: str  # runs.experiment
    title: str  # its report section
    spec: type | tuple[type, ...]  # the frozen dataclass(es) of one point
    run: Callable[..., Any]  # run(spec) -> Result, or run(ctx, spec) when distributed
    specs: Callable[..., list] | None = None  # specs(**options) -> its points, validated
    metrics: tuple[Metric, ...]
    tables: tuple[Table, ...] = ()
    view: str = ""  # its SQL view; default `<kind>_runs` (dashes as underscores)
    settings: tuple[str, ...] = ()  # the Spec's settings keys, in view order; default its fields
    compare: str | None = None  # the metric --compare sets side by side (a timed base or a name)
    distributed: bool = False  # run on a process group per world size
    # An experiment that runs both ways: run_on_ranks(ctx, spec) for its points whose
    # world_size is above 1, on a process group per world size; `run(spec)` for the others.
    run_on_ranks: Callable[..., Any] | None = None
    # Distributed: the modules every rank imports, once in the fork server (launcher.launch's
    # `preload`); None: torch and dynamo, which ranks that train need.
    rank_preload: tuple[str, ...] | None = None
    oom_axis: str | None = None  # after an OOM, skip the points larger along this setting
    # Points that are one measurement with one setting changed: called with every
    # (spec, Result) of such a group once the group has run, may set metrics across them.
    group_by: Callable[[Any], Any] | None = None
    across: Callable[[list[tuple[Any, Any]]], None] | None = None
    # Interleaved rounds (docs/methodology.md): split(spec) -> the spec of each round;
    # merge(spec, [the Result of each round]) -> the point's Result. The runner runs round 1
    # of every point, then round 2, ..., so that drift falls on every point alike.
    split: Callable[[Any], list[Any]] | None = None
    merge: Callable[[Any, list[Any]], Any] | None = None
    # Old metric key -> the metric it is now: rows stored before the rename hold the old key
    # (stored rows are never rewritten), and the view's column reads either.
    renamed: Mapping[str, str] = field(default_factory=dict)
    # Its report section beyond the declared tables: section(sec, rows) adds tables and plots
    # to the report's Section (report/sections.py) over the latest row of each point.
    section: Callable[[Any, list], None] | None = None
    draws: bool = False  # the section draws plots (the report starts its plotting process early)
    # Rows shown in tables of their own: (which rows, a suffix for those tables' titles).
    apart: tuple[Callable[[Mapping[str, Any]], bool], str] | None = None
    # Computed from formulas rather than measured (plan): a report shows it after the
    # measured sections, folded (an HTML <details>), so it never buries them.
    analytic: bool = False
    # What a point needs before it runs: estimate(spec) -> an object with `bytes`, `seconds`,
    # `refusal(device)` (why it cannot fit, or None) and `metrics()` (stored beside the
    # measurement); run_sweep skips a point that cannot fit unless forced.
    estimate: Callable[[Any], Any] | None = None
    # Its command, declared here (`Command`); None where cli/ writes it (cli/__init__.py
    # says which and why).
    command: Command | None = None

    def __post_init__(self) -> None:
        if not self.view:
            object.__setattr__(self, "view", f"{self.kind.replace('-', '_')}_runs")
        if not self.settings and isinstance(self.spec, type):
            object.__setattr__(self, "settings", settings_keys(self.spec))

    def setting_types(self) -> dict[str, str]:
        """Each Spec field -> its type as written (`int`, `str | None`); a Spec around a
        point (AroundPoint) gives the fields of the point's Spec(s)."""
        specs = list(self.spec if isinstance(self.spec, tuple) else (self.spec,))
        types: dict[str, str] = {}
        while specs:
            spec = specs.pop(0)
            for f in fields(spec):
                if f.name == "point" and issubclass(spec, AroundPoint):
                    point = get_type_hints(spec)["point"]
                    specs += [t for t in get_args(point) or (point,) if is_dataclass(t)]
                    continue
                types.setdefault(f.name, f.type if isinstance(f.type, str) else f.type.__name__)
        return types

    @property
    def metric_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.metrics)

    def metric(self, name: str) -> Metric:
        return next(m for m in self.metrics if m.name == name)

    def compare_columns(self) -> tuple[str, str, str, str | None, str | None]:
        """(label, mean column, unit, min column, max column) of the compared metric."""
        if self.compare is None:
            raise ValueError(f"{self.kind} declares no metric to compare")
        names = self.metric_names
        if f"{self.compare}_mean" in names:
            unit = self.metric(f"{self.compare}_mean").unit
            base = self.compare.removesuffix(f"_{unit}")
            return (f"{base} {unit}", f"{self.compare}_mean", unit,
                    f"{self.compare}_min", f"{self.compare}_max")
        unit = self.metric(self.compare).unit
        return f"{self.compare.removesuffix(f'_{unit}')} {unit}", self.compare, unit, None, None


class AroundPoint:
    """A Spec built around another kind's point, its `point` field (memory's and profile's
    around a model or attention point): it runs on that point's device, at its precision,
    which the runner, the estimates and the progress line read from every Spec."""

    @property
    def device(self) -> str:
        return self.point.device  # type: ignore[attr-defined]

    @property
    def precision(self) -> str:
        return self.point.precision  # type: ignore[attr-defined]


def settings_keys(spec: type, drop: tuple[str, ...] = (), rename: Mapping[str, str] = ()) -> tuple[str, ...]:
    """The settings keys of a Spec dataclass: its field names, `rename`d, without `drop` and
    those NOT_A_SETTING (sweep/points.py)."""
    rename = dict(rename)
    return tuple(rename.get(f.name, f.name) for f in fields(spec)
                 if f.name not in drop and is_setting(f))


HOST_BOUND = Column(
    "host-bound",
    "launch_bound_phases",
    optional=True,
    note="host-bound: the phases whose host time (until their calls returned, before the "
    "sync) was at least 90 % of their wall time on the GPU, so the GPU waited for Python and "
    "kernel launches and the time is the host's. A larger batch, torch.compile or CUDA "
    "graphs help; faster kernels do not.",
)
