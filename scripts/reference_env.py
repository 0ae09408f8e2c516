"""The environment variables hpolab reads or sets: the table docs/reference/environment.md is made from
(scripts/reference_docs.py).

`env_uses()` finds them in the package's source without importing it: every `os.environ.get(NAME, ...)`,
`os.getenv(NAME)`, `os.environ[NAME]`, `environ.get(NAME)` (a mapping handed in), `os.environ.pop`,
`.setdefault` and `.update`, with NAME a string, a module constant, an f-string or a comprehension's
variable over a literal tuple or dict. tests/test_reference_docs.py fails when a variable is used but
missing from ENV below, or listed in ENV but no longer used: a new variable needs a line here.
"""

from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "platform" / "hpolab"

STORES, TIMING, PROCESSES, MLFLOW, RECORDED, SET, INTERNAL = (
    "Stores", "Timeouts and intervals", "Processes and files", "MLflow's own variables hpolab honours",
    "Recorded on each run", "Set by hpolab for the processes it starts", "For hpolab's own use")

SECTIONS = {
    STORES: "Where the stores are. A command-line option wins over the variable; without either, the "
            "embedded store in `./mlruns`. `hpolab launch` also reads them from a `.env` file in the working directory.",
    TIMING: "Seconds unless said. The defaults suit a team on one network; raise them for a slow or far store.",
    PROCESSES: "",
    MLFLOW: "MLflow reads these itself; hpolab also reads them where it talks to an MLflow server without "
            "MLflow's client (the read commands' REST path, the pre-flight check, `hpolab launch`).",
    RECORDED: "Read from a scheduler's environment and written as `env.*` tags on every run a driver makes "
              "([MLflow names](mlflow.md)).",
    SET: "hpolab sets these in its own process or in the servers and jobs it starts; you do not need to.",
    INTERNAL: "Not for users: what hpolab passes to its own processes, and a hook for the test suite.",
}

# name -> (section, meaning, default when the code that reads it gives none)
ENV = {
    "HPOLAB_STORE": (STORES, "the store folder, like `--store DIR`", "`./mlruns`"),
    "OPTUNA_STORAGE": (STORES, "the Optuna storage URL, like `--storage URL` (e.g. `postgresql+psycopg2://...`, "
                               "`grpc://host:13000`)", "`sqlite:///STORE/optuna.db`"),
    "MLFLOW_TRACKING_URI": (STORES, "the MLflow tracking URI, like `--tracking-uri URI` (e.g. `http://host:5000`)",
                            "`sqlite:///STORE/mlflow.db`"),
    "HPOLAB_STORE_CONNECT_TIMEOUT": (TIMING, "seconds a database connect may take before the store is called "
                                             "unreachable (pre-flight check; PostgreSQL read commands)", None),
    "HPOLAB_STORE_HTTP_TIMEOUT": (TIMING, "seconds the pre-flight request to an MLflow server may take", None),
    "HPOLAB_HEARTBEAT_INTERVAL": (TIMING, "seconds between a running trial's heartbeats in the Optuna storage", None),
    "HPOLAB_GRACE_PERIOD": (TIMING, "seconds without a heartbeat after which another host's trial counts as dead "
                                    "and is reaped (retried from its checkpoint)", "6 x `HPOLAB_HEARTBEAT_INTERVAL` (60)"),
    "HPOLAB_LOCK_TIMEOUT": (TIMING, "seconds a worker waits for a study's budget lock before it gives up (exit 1)", None),
    "HPOLAB_LR_TEST_LOCK_TIMEOUT": (TIMING, "seconds a worker waits for another worker's LR range test to finish", None),
    "HPOLAB_METRICS_FLUSH_S": (TIMING, "seconds between a run's metric writes while its epochs are shorter than that "
                                       "(metrics are batched per run; a driver killed mid-trial leaves at most "
                                       "that much unwritten, which the next driver restores)", None),
    "HPOLAB_DB_POOL_SIZE": (PROCESSES, "connections each process keeps to a PostgreSQL Optuna storage (N workers "
                                       "hold at most N times this many)", None),
    "HPOLAB_FORKSERVER": (PROCESSES, "`new`: start each trial from a fresh interpreter instead of a fork of the "
                                     "driver (for an experiment that imports a library whose threads a fork "
                                     "would leave behind)", "fork"),
    "HPOLAB_HOST_SLOTS_DIR": (PROCESSES, "the folder where drivers on one machine note their CPUs and trial slots "
                                         "to share the CPUs between their trials", "`/dev/shm/hpolab-slots-UID`"),
    "HPOLAB_SYSTEM_METRICS_INTERVAL": (PROCESSES, "seconds between two samples of a trial's processes for its "
                                                  "`system/` metrics (`system_metrics: false` turns them off)", "2"),
    "HPOLAB_NOTIFY_EXIT_WAIT": (PROCESSES, "seconds a driver's end waits for notifications still being delivered "
                                           "(what is left is counted as dropped)", "10"),
    "HPOLAB_CACHE": (PROCESSES, "where migrated empty databases are kept, copied into each new embedded store, and which "
                     "installed distribution owns which module (per set of installed distributions)",
                     "`$XDG_CACHE_HOME/hpolab` or `~/.cache/hpolab`"),
    "XDG_CACHE_HOME": (PROCESSES, "the cache folder `HPOLAB_CACHE` defaults to (under `hpolab/`)", "`~/.cache`"),
    "MLFLOW_TRACKING_USERNAME": (MLFLOW, "user name for an MLflow server with a login (`--app-name basic-auth`); "
                                        "never put it in a URL", None),
    "MLFLOW_TRACKING_PASSWORD": (MLFLOW, "its password", None),
    "MLFLOW_TRACKING_TOKEN": (MLFLOW, "a bearer token instead of a user name and password", None),
    "MLFLOW_TRACKING_INSECURE_TLS": (MLFLOW, "`true`: do not verify the server's TLS certificate", None),
    "MLFLOW_TRACKING_SERVER_CERT_PATH": (MLFLOW, "a CA bundle to verify the server's certificate with", None),
    "MLFLOW_TRACKING_CLIENT_CERT_PATH": (MLFLOW, "a client certificate to present to the server", None),
    "MLFLOW_TRACKING_AUTH": (MLFLOW, "a custom MLflow auth provider: the read commands then use MLflow's client "
                                     "instead of their REST path", None),
    "MLFLOW_WORKSPACE": (MLFLOW, "an MLflow workspace: as `MLFLOW_TRACKING_AUTH`", None),
    "SLURM_JOB_ID": (RECORDED, "tag `env.slurm_job_id`", None),
    "SLURM_ARRAY_JOB_ID": (RECORDED, "tag `env.slurm_array_job_id`", None),
    "SLURM_ARRAY_TASK_ID": (RECORDED, "tag `env.slurm_array_task_id`", None),
    "SLURMD_NODENAME": (RECORDED, "tag `env.slurm_node`", None),
    "SLURM_RESTART_COUNT": (RECORDED, "tag `env.slurm_restart_count` (a requeued task)", None),
    "JOB_COMPLETION_INDEX": (RECORDED, "tag `env.k8s_job_completion_index` (a Kubernetes Indexed Job)", None),
    "HPOLAB_K8S_POD": (RECORDED, "tag `env.k8s_pod` (`hpolab launch k8s` sets it from the pod's name)", None),
    "HPOLAB_K8S_NODE": (RECORDED, "tag `env.k8s_node` (`hpolab launch k8s` sets it from the node's name)", None),
    "CUDA_VISIBLE_DEVICES": (SET, "each trial's GPUs, mapped through the worker's own value", None),
    "CUBLAS_WORKSPACE_CONFIG": (SET, "`:4096:8` when `trainer.deterministic` is on a GPU (cuBLAS needs it to be "
                                     "deterministic), unless already set", None),
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": (SET, "`false` unless set: no progress bars in the driver's output", None),
    "MLFLOW_DISABLE_TELEMETRY": (SET, "`true` in the trial processes that export models", None),
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": (SET, "`0` during the pre-flight request only (a down server is said in seconds)", None),
    "MLFLOW_HTTP_REQUEST_TIMEOUT": (SET, "`HPOLAB_STORE_HTTP_TIMEOUT` during the pre-flight request only", None),
    "MLFLOW_BACKEND_STORE_URI": (SET, "the `mlflow server` of `hpolab ui` (and the server `launch k8s --with-stores` "
                                      "writes): the store's database", None),
    "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": (SET, "`false` for the servers hpolab starts (MLflow's job runner is not used)", None),
    "HPOLAB_FORKSERVER_EXPERIMENT": (INTERNAL, "the experiment module the forkserver preloads (removed once read)", None),
    "HPOLAB_TEST_HOSTNAME": (INTERNAL, "the host name owner records use: the test suite's way to play another host", None),
    "HPOLAB_KILL_AT": (INTERNAL, "`<transition>:<before|after>[:<n>]`: the driver SIGKILLs itself at that point of a trial's "
                                 "lifecycle (the suite's kill-point tests)", None),
    "HPOLAB_KILL_MARK": (INTERNAL, "a file a driver writes the kill point to just before HPOLAB_KILL_AT kills it (the suite's)", None),
}


@dataclass
class Use:
    reads: set[str] = field(default_factory=set)  # modules
    sets: set[str] = field(default_factory=set)
    defaults: list[str] = field(default_factory=list)  # the default a read gives, as written in the code


def _module_constants(tree: ast.Module) -> dict[str, ast.expr]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
    return out


def _strings(node: ast.expr | None, scope: dict[str, list[str]], consts: dict[str, ast.expr]) -> list[str]:
    """The string values `node` can take: a literal, a constant, a comprehension's variable, an f-string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        if node.id in scope:
            return scope[node.id]
        if node.id in consts and isinstance(consts[node.id], ast.Constant):
            return _strings(consts[node.id], scope, consts)
        return []
    if isinstance(node, ast.JoinedStr):
        parts = [_strings(v.value if isinstance(v, ast.FormattedValue) else v, scope, consts) for v in node.values]
        return ["".join(p) for p in itertools.product(*parts)]
    return []


def _items(node: ast.expr, consts: dict[str, ast.expr], local: dict[str, ast.expr]) -> list[str]:
    """The keys or items of a literal tuple/list/set/dict, or of a (module or local) name bound to one."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("items", "keys"):
        node = node.func.value
    if isinstance(node, ast.Name):
        node = local.get(node.id) or consts.get(node.id) or node
    if isinstance(node, ast.Dict):
        return [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return []


def _is_environ(node: ast.expr) -> bool:
    """`os.environ`, or a parameter named environ/env (a mapping of the environment handed in or copied)."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (isinstance(node, ast.Name) and node.id in ("environ", "env"))


class _Finder(ast.NodeVisitor):
    def __init__(self, module: str, tree: ast.Module, found: dict[str, Use]):
        self.module, self.consts, self.found = module, _module_constants(tree), found
        self.scope: dict[str, list[str]] = {}
        self.local: dict[str, ast.expr] = {}

    def _note(self, names: list[str], kind: str, default: ast.expr | None = None) -> None:
        for name in names:
            use = self.found.setdefault(name, Use())
            getattr(use, kind).add(self.module)
            if default is not None and kind == "reads":
                value = self.consts.get(default.id) if isinstance(default, ast.Name) else default
                if isinstance(value, ast.Constant):
                    if value.value not in (None, ""):
                        use.defaults.append(str(value.value))
                else:
                    use.defaults.append(ast.unparse(default))

    def visit_FunctionDef(self, node):
        saved = self.local
        self.local = {t.id: n.value for n in ast.walk(node) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        self.generic_visit(node)
        self.local = saved

    visit_AsyncFunctionDef = visit_FunctionDef

    def _comprehension(self, node):
        saved = dict(self.scope)
        for gen in node.generators:
            target = gen.target.elts[0] if isinstance(gen.target, ast.Tuple) else gen.target
            if isinstance(target, ast.Name):
                self.scope[target.id] = _items(gen.iter, self.consts, self.local)
        self.generic_visit(node)
        self.scope = saved

    visit_GeneratorExp = visit_ListComp = visit_SetComp = visit_DictComp = _comprehension

    def visit_Call(self, node):
        f = node.func
        if isinstance(f, ast.Attribute) and _is_environ(f.value) and node.args:
            names = _strings(node.args[0], self.scope, self.consts)
            if f.attr in ("get", "pop"):
                self._note(names, "reads", node.args[1] if len(node.args) > 1 else None)
            elif f.attr == "setdefault":
                self._note(names, "sets")
            elif f.attr == "update":
                self._note(_items(node.args[0], self.consts, self.local), "sets")
        elif isinstance(f, ast.Attribute) and f.attr == "getenv" and node.args:
            self._note(_strings(node.args[0], self.scope, self.consts), "reads", node.args[1] if len(node.args) > 1 else None)
        self.generic_visit(node)

    def visit_Subscript(self, node):
        if _is_environ(node.value):
            self._note(_strings(node.slice, self.scope, self.consts), "sets" if isinstance(node.ctx, ast.Store) else "reads")
        self.generic_visit(node)


def env_uses() -> dict[str, Use]:
    """Every environment variable the package reads or sets -> where and how."""
    found: dict[str, Use] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE.parent).with_suffix("").as_posix().replace("/", ".")
        tree = ast.parse(path.read_text())
        _Finder(module, tree, found).visit(tree)
    return {k: v for k, v in found.items() if re.fullmatch(r"[A-Z][A-Z0-9_]*", k)}


def rows() -> dict[str, list[tuple[str, str, str, str]]]:
    """Section -> (name, default, meaning, modules) per variable, in ENV's order; SystemExit when ENV and
    the code disagree (the test says the same with the names)."""
    uses = env_uses()
    missing, stale = sorted(set(uses) - set(ENV)), sorted(set(ENV) - set(uses))
    if missing or stale:
        raise SystemExit(f"scripts/reference_env.py ENV: add {missing}, drop {stale}")
    out: dict[str, list] = {s: [] for s in SECTIONS}
    for name, (section, meaning, default) in ENV.items():
        use = uses[name]
        code_default = sorted(set(use.defaults))
        shown = default or (", ".join(f"`{d}`" for d in code_default) if code_default else "")
        where = sorted(use.reads) if section not in (SET,) else sorted(use.sets or use.reads)
        out[section].append((name, shown, meaning, ", ".join(m.removeprefix("hpolab.") for m in where)))
    return out
