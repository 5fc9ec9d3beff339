"""Session-scoped real engines, one per server configuration, shared.

The shared ones: ours as a decode pool runs it and vLLM's own as the oracle, and the production-like
one (every frontend flag and LoRA adapters, tests/prod_server.py). Those the session's tests use
start together when the session starts, beside the first (in-process) tests. A module that needs
another real configuration starts its own; one that differs only in frontend behaviour (tokens-only
rules, no parsers, another stream interval) is checked in process (tests/inprocess.py)."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

from decode_server.compat import VLLM_LINE
from decode_server.tools.demo_model import build_demo_model
from tests import prod_server as prod
from tests import beside, servers, vllm033_tier

# tests/vllm033 is its own session on vLLM 0.33's modules: tests/test_vllm033.py starts it (and fails
# with its output), so the suite on 0.32 runs it through that one test, not by collecting it.
collect_ignore = [] if VLLM_LINE == "0.33" else ["vllm033"]


def pytest_configure(config):
    config.addinivalue_line("markers", "ends_prod_server: ends the shared prod_server (runs after its other users)")
    config.stash[_BEGAN] = time.time()


def _uses(item: pytest.Item, *fixtures: str) -> bool:
    return bool(set(getattr(item, "fixturenames", ())) & set(fixtures))


# The modules with engines of their own, in the order they run. The first one's engines start
# early (see `_launch_points`) and it has timed checks, so nothing starts beside it: the next one's
# three engines start at its own beginning (a wait with both cores busy), and test_faults' one while
# that module runs (test_faults has timed checks too: the P/D set starts at test_pd's beginning).
OWN_ENGINES_ORDER = ("test_api_server_count", "test_parser_matrix_real", "test_faults", "test_pd", "test_pd_faults")
# The modules whose work starts at collection (`start_beside_the_suite`), in the order they start:
# the sessions beside the suite run one at a time in that order (tests/beside.py), and the first
# own-engine module's engines start when the 0.33 tier is done (`_first_engines_due`).
BESIDE_ORDER = ("test_vllm033", "test_parser_matrix_beside", "test_images_resolve")


def _order_in(order: tuple[str, ...], module: object) -> int:
    name = getattr(module, "__name__", "").rpartition(".")[2]
    return order.index(name) if name in order else len(order)


def _move_beside(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A module that stands for another one run beside the suite (`MOVES_BESIDE`: that one's path),
    selected with that one's tests, takes them out of the main session into its own
    (tests/beside.py)."""
    targets = {getattr(getattr(item, "module", None), "MOVES_BESIDE", None) for item in items} - {None}
    moved = {target: [item for item in items if item.nodeid.split("::")[0] == target] for target in targets}
    gone = {item for chosen in moved.values() for item in chosen}
    if gone:
        config.hook.pytest_deselected(items=list(gone))
        items[:] = [item for item in items if item not in gone]
    config.stash[beside.MOVED] = {target: [item.nodeid for item in chosen] for target, chosen in moved.items() if chosen}


def pytest_collection_modifyitems(config, items):
    """The tests run beside the suite moved out of it (`_move_beside`); in-process tests first,
    while the shared engines start (`_engines_start_early`); then the real-engine tests on the
    shared engines, each shared engine stopped after its last user (the prod server's first: the
    tests that end it come right after its other users); then the modules with engines of their own
    (`ENGINES`, or the P/D set), which start while the shared engines' tests run, into the memory
    those leave; last, the tests that wait for work started at collection (`BESIDE_ORDER`).
    Otherwise in collection order."""
    _move_beside(config, items)
    by_module: dict = {}
    for item in items:
        by_module.setdefault(getattr(item, "module", None), []).append(item)

    def module_phase(module: object) -> tuple[int, int]:
        mine = by_module[module]
        if hasattr(module, "ENGINES") or any(_uses(item, "pd_set") for item in mine):
            return 4, _order_in(OWN_ENGINES_ORDER, module)
        return (1 if any(_uses(item, "prod_server") for item in mine) else 3), 0

    def phase(item: pytest.Item) -> int:
        module = getattr(item, "module", None)
        # A module whose work starts at collection (`start_beside_the_suite`) waits for it as late
        # as possible, so that it runs beside as much of the suite as it can.
        if hasattr(module, "start_beside_the_suite"):
            return 5, _order_in(BESIDE_ORDER, module)
        if not item.get_closest_marker("real_engine"):
            return 0, 0
        if item.get_closest_marker("ends_prod_server"):
            return 2, 0
        return module_phase(module)

    items.sort(key=phase)  # stable


def pytest_collection_finish(session):
    """A module whose tests wait on slow outside work (a process of its own, the network) defines
    `start_beside_the_suite(items)`: called now with its selected items, it starts that work, which
    then runs beside the rest of the suite."""
    by_module: dict = {}
    for item in session.items:
        module = getattr(item, "module", None)
        if module is not None:
            by_module.setdefault(module, []).append(item)
    for module, items in by_module.items():
        start = getattr(module, "start_beside_the_suite", None)
        if start is not None:
            start(items)
    session.config.stash[_TIER_SELECTED] = vllm033_tier.running()
    # Where engines start and stop, worked out once for the run's order (the hooks below ask per test).
    session.config.stash[_LAUNCHES] = _launch_points(session)
    session.config.stash[_FIRST] = _engine_modules(session)[:1]
    session.config.stash[_LAST_USERS] = _last_users(session)


def pytest_sessionfinish(session):
    beside.stop_all()  # a session ended before their tests (-x, Ctrl+C)


def pytest_terminal_summary(terminalreporter, config):
    """When the sessions beside the suite ran, and when each module with timed checks began and
    ended: whether they overlapped is what a slow timed check in a clean-clone run is read against."""
    began = config.stash[_BEGAN]
    lines = beside.spans(began)
    lines += [f"{name} (timed checks): {a - began:.0f}-{b - began:.0f} s" for name, (a, b) in config.stash.get(_TIMED, {}).items()]
    if lines:
        terminalreporter.write_sep("-", "beside the suite")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def demo_model(tmp_path_factory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("model") / "demo")


@pytest.fixture(scope="session")
def tokenizer(demo_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_model)


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-logs")


def _fixtures_used(session: pytest.Session) -> set[str]:
    return {name for item in session.items for name in getattr(item, "fixturenames", ())}


SHARED = ("server", "vllm_server", "prod_server")
_POOL = pytest.StashKey["servers.SharedServers"]()


def _module_order(session: pytest.Session) -> list:
    """The session's modules in the order they run."""
    modules: list = []
    for item in session.items:
        module = getattr(item, "module", None)
        if module is not None and module not in modules:
            modules.append(module)
    return modules


def _engine_modules(session: pytest.Session) -> list:
    """The session's modules that start engines of their own (a module-level `ENGINES`: name ->
    factory(demo_model, log_dir)), in the order they run."""
    return [module for module in _module_order(session) if hasattr(module, "ENGINES")]


@pytest.fixture(scope="session")
def shared_servers(demo_model, log_dir, lora_adapters, request):
    """Every real engine the session starts, by name: the shared ones and each module's `ENGINES`."""
    factories = {
        # Ours, as a decode pool runs it: tokenizer, qwen3 reasoning + hermes tool parsers.
        "server": lambda: servers.ours("decode", demo_model, log_dir, *servers.PARSER_FLAGS),
        # vLLM 0.32's own server on the same engine configuration: the parity oracle.
        "vllm_server": lambda: servers.vllms_own("vllm", demo_model, log_dir, *servers.PARSER_FLAGS),
        # Every frontend flag and LoRA (tests/prod_server.py).
        "prod_server": lambda: prod.server(demo_model, log_dir, lora_adapters[prod.ADAPTER]),
    }
    for module in _engine_modules(request.session):
        factories.update({name: functools.partial(build, demo_model, log_dir) for name, build in module.ENGINES.items()})
    pool = servers.SharedServers(factories)
    request.config.stash[_POOL] = pool
    try:
        yield pool
    finally:
        pool.stop()


@pytest.fixture(scope="session", autouse=True)
def _engines_start_early(request):
    """The shared engines the session uses start when the session does, beside the in-process
    tests that run first; modules' own engines at their launch points; a session that uses none
    builds nothing."""
    shared = _fixtures_used(request.session) & set(SHARED)
    if shared or _engine_modules(request.session):
        pool = request.getfixturevalue("shared_servers")
        pool.launch(shared)


_LAUNCHES = pytest.StashKey[dict]()
_TIER_SELECTED = pytest.StashKey[bool]()
_FIRST = pytest.StashKey[list]()
_LAST_USERS = pytest.StashKey[dict]()
_BEGAN = pytest.StashKey[float]()
_TIMED = pytest.StashKey[dict]()  # module name -> [first setup, last teardown], time.time()


def _launch_points(session: pytest.Session) -> dict:
    """Module -> the engines to launch when it begins. A module's own engines start when the module
    before it in the run begins, so that their start-up overlaps that module's tests, unless that
    one has timed checks (`NOTHING_STARTS_BESIDE`): then when it begins itself. The first such
    module's start at `_first_engines_due`."""
    order = _module_order(session)
    points: dict = {}
    for module in _engine_modules(session)[1:]:
        at = order.index(module)
        before = order[at - 1] if at else module
        trigger = module if getattr(before, "NOTHING_STARTS_BESIDE", False) else before
        points.setdefault(trigger, {}).update(module.ENGINES)
    return points


def _first_engines_due(item: pytest.Item) -> bool:
    """The first module's own engines start once the vLLM 0.33 tier's process is done: from then on
    the in-process tests use one core and the engines start on the other (a measured idle stretch
    of minutes), in the memory the tier leaves. Without that tier, when the first test on the shared
    engines begins; at the latest, when a test with engines of its own does."""
    if item.get_closest_marker("real_engine"):
        return _uses(item, "server", "vllm_server") or hasattr(getattr(item, "module", None), "ENGINES")
    return item.config.stash.get(_TIER_SELECTED, False) and not vllm033_tier.running()


def _last_users(session: pytest.Session) -> dict:
    """Test nodeid -> the shared engines that no test after it uses."""
    last: dict = {}
    for item in session.items:
        for name in SHARED:
            if _uses(item, name):
                last[name] = item.nodeid
    users: dict = {}
    for name, nodeid in last.items():
        users.setdefault(nodeid, []).append(name)
    return users


def _note_timed(item: pytest.Item, end: bool) -> None:
    module = getattr(item, "module", None)
    if getattr(module, "NOTHING_STARTS_BESIDE", False):
        span = item.config.stash.setdefault(_TIMED, {}).setdefault(module.__name__, [time.time(), time.time()])
        if end:
            span[1] = time.time()


def pytest_runtest_setup(item):
    _note_timed(item, end=False)
    pool = item.config.stash.get(_POOL, None)
    if pool is None:
        return
    pool.launch(item.config.stash[_LAUNCHES].get(getattr(item, "module", None), {}))
    first = item.config.stash[_FIRST]
    if first and _first_engines_due(item):
        pool.launch(first[0].ENGINES)


def pytest_runtest_teardown(item, nextitem):
    """A shared engine is stopped once its last user has run (in the background: its memory goes
    to the engines that start next)."""
    _note_timed(item, end=True)
    pool = item.config.stash.get(_POOL, None)
    if pool is None:
        return
    users = item.config.stash[_LAST_USERS]
    if item.nodeid in users:
        pool.stop_in_background(users[item.nodeid])


@pytest.fixture(scope="session")
def server(shared_servers):
    return shared_servers.get("server")


@pytest.fixture(scope="session")
def vllm_server(shared_servers):
    return shared_servers.get("vllm_server")


@pytest.fixture(scope="session")
def lora_adapters(demo_model, tmp_path_factory) -> dict[str, Path]:
    """Two random-weight adapters for the demo model: one the prod server serves from its start, one
    loaded at runtime."""
    root = tmp_path_factory.mktemp("lora")
    return {name: prod.build_adapter(demo_model, root / name, seed) for name, seed in ((prod.ADAPTER, 1), ("second", 2))}


@pytest.fixture(scope="session")
def prod_server(shared_servers):
    """Every frontend flag and LoRA on one real engine (tests/prod_server.py)."""
    return shared_servers.get("prod_server")


@pytest.fixture
def anyio_backend():
    """Async tests (`pytest.mark.anyio`) run on asyncio, the loop the server and vLLM use."""
    return "asyncio"


@pytest.fixture
async def inproc(demo_model):
    """The app over the scripted engine, as the decode pool runs it (the `server` fixture's flags)."""
    from tests.inprocess import serve

    async with serve(demo_model, *servers.PARSER_FLAGS) as app:
        yield app
