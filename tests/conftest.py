"""Real servers for the whole suite.

A session fixture starts embedded PostgreSQL and Redis (or uses
POLLER_TEST_DATABASE_URL / POLLER_TEST_REDIS_URL); the brokers (NATS, RabbitMQ) are
started once for the whole run, on the first test that asks (POLLER_TEST_NATS_URL /
POLLER_TEST_RABBITMQ_URL), migrates a template
database once, and every test that asks for ``db_url`` gets a fresh database
cloned from it (CREATE DATABASE … TEMPLATE …): isolated, and cloned while the
test before it ran (:class:`_Clones`).
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine

from poller.endpoints.registry import CreatedEndpoint, create_endpoint
from poller.errors import EmbeddedServerError
from poller.local.brokers import EmbeddedNats, EmbeddedRabbitMQ
from poller.local.embedded import EmbeddedPostgres, EmbeddedRedis, _file_lock
from poller.service.server_watch import stop_at_exit
from poller.settings import default_settings
from poller.store import migrate
from poller.store.db import async_engine, libpq_url, sync_engine

TEMPLATE = f"poller_template_{os.getpid()}"


def _statement_range_or_line(*args: Any, **kwargs: Any) -> Any:
    """pytest's source lookup for a failure's traceback, where CPython 3.11.7's parser can
    raise ``SystemError: AST constructor recursion depth mismatch`` (seen in a worker after
    a hypothesis test): then the failure is reported with one line of source, instead of
    the worker dying with an INTERNALERROR that hides every result."""
    try:
        return _getstatementrange_ast(*args, **kwargs)
    except SystemError as exc:
        raise SyntaxError(str(exc)) from exc  # pytest falls back to the failing line


# A private function of pytest's, so: only when it is there (pytest is pinned in
# requirements-dev.lock; an upgrade that renames it loses this fallback, not the suite).
try:
    import _pytest._code.code as _pytest_code
except ImportError:  # moved: the fallback goes, the suite stays
    _pytest_code = None
_getstatementrange_ast = getattr(_pytest_code, "getstatementrange_ast", None)
if _getstatementrange_ast is not None:
    _pytest_code.getstatementrange_ast = _statement_range_or_line
_counter = itertools.count()


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    query = url.partition("?")[2]
    return f"{base}/{name}" + (f"?{query}" if query else "")


def _memory_dir() -> str | None:
    """/dev/shm when it is a writable tmpfs with room to spare, else None (the system's
    temporary folder).

    Most tests clone the template database, and a clone writes its 8 MB twice (the
    files and the WAL): on this machine's virtual disk the kernel's writeback made a
    clone take 0.1-0.4 s, against 0.02 s in memory, and clones were a third of the
    suite's worker time. The servers are throwaway (fsync off) either way."""
    shm = "/dev/shm"  # a folder of our own is made inside it, mode 0700
    try:
        room = os.statvfs(shm)
    except OSError:
        return None
    enough = room.f_bavail * room.f_frsize >= 4 * 2**30
    return shm if enough and os.access(shm, os.W_OK) else None


@contextlib.contextmanager
def _server_dir(name: str) -> Iterator[Path]:
    """A folder for a session's embedded server, outside pytest's temporary folders (a
    second pytest run — one test file, while the suite runs — removes the oldest of
    those, and took a running suite's PostgreSQL with it), in memory if it can be."""
    folder = Path(tempfile.mkdtemp(prefix=f"poller-test-{name}-", dir=_memory_dir()))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """URL of a database on the test server with rights to create databases."""
    external = os.environ.get("POLLER_TEST_DATABASE_URL")
    if external:
        yield external
        return
    with _server_dir("pg") as folder:
        server = EmbeddedPostgres(folder, durable=False)
        stop_at_exit(server, remove=folder)  # a killed worker leaves no server behind
        try:
            yield server.start()
        finally:
            server.stop()


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    migrate.upgrade(_with_database(pg_admin_url, TEMPLATE))
    # No session may open the template: CREATE DATABASE waits, 0.1 s at a time, for every
    # other session in its template to leave, and autovacuum visits a freshly written one.
    with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{TEMPLATE}" WITH ALLOW_CONNECTIONS false')
    yield TEMPLATE
    with psycopg.connect(libpq_url(pg_admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')


# Under pytest-xdist, tests that run fleets of processes take a shared lock, and tests
# that measure a rate or a timing window an exclusive one: they run beside light tests,
# fleets beside each other two at a time, and never a measuring test beside a fleet.
# On two cores, more at once starved each other: a 200/s rate limit measured at 151/s,
# a load test too slow to lose the message it was told to lose, three fleets whose
# pollers' claims expired and sent messages twice. (xdist's `--dist loadgroup` does
# not group under pytest 9's node ids.)
FLEETS = (  # files, or the tests of a file that are fleets (as for MEASURING)
    "tests/faults/test_scenarios.py::test_scenario_loses_nothing_and_explains_every_duplicate",
    "tests/acceptance/test_demo.py",
    "tests/acceptance/test_failover.py",
    "tests/acceptance/test_processes.py",
    "tests/acceptance/test_run.py",
    "tests/integration/test_concurrency.py",
    "tests/integration/test_election.py::test_no_loss_no_double_flight_without_a_single_leader",
    "tests/integration/test_election.py::test_three_pollers_balance_eight_shards",
    "tests/integration/test_election_redis.py",
    "tests/integration/test_service_faults.py::test_postgres_restart_under_load_loses_nothing",
)
MEASURING = (  # files, or one test of a file (its checker tests beside it are light)
    # no live poller's claim may expire: its heartbeats must run
    "tests/faults/test_hunt.py::test_the_hunt_breaks_no_invariant",
    "tests/acceptance/test_loadtest.py",
    "tests/integration/test_health_circuit.py",
    "tests/integration/test_health_rate_limits.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the fleets and the measuring tests, and put them first, the measuring ones
    before the fleets. xdist's worksteal hands each worker a contiguous part of this
    order, so one worker starts with all of them and runs them one after another while
    the others run light tests, and steals fleets from it once they are done. Measuring
    tests left for the end ran alone while the other workers idled; fleets at the end
    blocked a worker on the lock while the measuring ones ran (6:17 in all, 2:30 idle)."""
    root = repo_root()
    order: dict[str, tuple[int, int]] = {}
    for item in items:
        where = f"{item.path.relative_to(root).as_posix()}::{item.name}"
        measuring = [n for n, prefix in enumerate(MEASURING) if where.startswith(prefix)]
        fleet = [n for n, prefix in enumerate(FLEETS) if where.startswith(prefix)]
        if measuring:
            item.add_marker(pytest.mark.serial(exclusive=True))
            order[item.nodeid] = (0, measuring[0])
        elif fleet:  # in FLEETS's order: the longest first, none of them last
            item.add_marker(pytest.mark.serial(exclusive=False))
            order[item.nodeid] = (1, fleet[0])
        else:
            order[item.nodeid] = (2, 0)
    items.sort(key=lambda item: order[item.nodeid])  # stable: the same in every worker


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outside pytest-timeout: waiting is free
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """A ``serial`` test holds the lock the run's xdist workers share while it runs."""
    run = getattr(item.config, "workerinput", {}).get("testrunuid")
    mark = item.get_closest_marker("serial")
    if run is None or mark is None:
        return (yield)
    path = _lock_path(run)
    with open(path, "a") as lock, contextlib.ExitStack() as slots:  # released on close
        fcntl.flock(lock, fcntl.LOCK_EX if mark.kwargs["exclusive"] else fcntl.LOCK_SH)
        if not mark.kwargs["exclusive"]:
            slots.enter_context(_fleet_slot(path))
        return (yield)


def _lock_path(run: str) -> Path:
    return Path(tempfile.gettempdir()) / f"webhook-poller-tests-{run}.lock"


_RUNS = pytest.StashKey[set[str]]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """In the xdist controller: the run's id, whose lock files the workers share."""
    node.config.stash.setdefault(_RUNS, set()).add(node.workerinput["testrunuid"])


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In the controller, once every worker is done: the run's lock files go (each run
    left three empty files in the temporary directory)."""
    for run in session.config.stash.get(_RUNS, set()):
        lock = _lock_path(run)
        for path in (lock, *(Path(f"{lock}.slot{n}") for n in range(FLEET_SLOTS))):
            path.unlink(missing_ok=True)


FLEET_SLOTS = 2  # fleets at once: one a core (three starved each other's leases)


@contextlib.contextmanager
def _fleet_slot(lock: Path) -> Iterator[None]:
    """One of :data:`FLEET_SLOTS` places for a fleet: a free one, else wait for one."""
    files = [open(f"{lock}.slot{n}", "a") for n in range(FLEET_SLOTS)]  # noqa: SIM115
    try:
        for held in files:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                continue
        else:
            fcntl.flock(files[os.getpid() % FLEET_SLOTS], fcntl.LOCK_EX)
        yield
    finally:
        for each in files:
            each.close()


def create_database(admin_url: str, template: str | None) -> str:
    """A new database (cloned from ``template`` if given); returns its URL.

    A clone copies the template's files (``STRATEGY FILE_COPY``, PostgreSQL 15+) rather
    than writing each page to the WAL as the default does: as fast in memory (0.02 s),
    and a server's WAL does not grow by 8 MB a test until its next checkpoint."""
    name = f"poller_test_{os.getpid()}_{next(_counter)}"
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        clause = ""
        if template:
            clause = f' TEMPLATE "{template}"'
            if conn.info.server_version >= 150000:
                clause += " STRATEGY FILE_COPY"
        conn.execute(f'CREATE DATABASE "{name}"{clause}')
    return _with_database(admin_url, name)


def drop_database(admin_url: str, url: str) -> None:
    name = url.rpartition("/")[2].partition("?")[0]
    with psycopg.connect(libpq_url(admin_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class _Clones:
    """Databases cloned from the template one test ahead, and dropped after their test,
    in a thread of their own.

    A clone took 0.4-0.5 s on the test machine, nearly all of it the server's (a
    statement's wait, copying the template's 8 MB), and most tests take one: done
    in the foreground it was a third of the suite's worker time. Cloned while the
    test before runs, it is most often ready when asked for; a used one is dropped
    while the next test runs. Every test still gets a database of its own that no
    test used before."""

    def __init__(self, admin_url: str, template: str) -> None:
        self._admin_url, self._template = admin_url, template
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="db-clone")
        self._next: Future[str] | None = None

    def take(self, *, then_ahead: bool = True) -> str:
        """A clone no test used; the next one is started unless ``then_ahead`` is False
        (a measuring test: it runs with no clone of its own worker beside it)."""
        ahead, self._next = self._next, None
        try:
            url = ahead.result() if ahead is not None else self._clone()
        except psycopg.Error:  # cloned ahead while the server was away: once more, now
            url = self._clone()
        if then_ahead:
            self.ahead()
        return url

    def ahead(self) -> None:
        if self._next is None:
            self._next = self._pool.submit(self._clone)

    def drop(self, url: str) -> None:
        """Drop a used clone in the background, before the next clone is made."""
        self._pool.submit(drop_database, self._admin_url, url)

    def _clone(self) -> str:
        return create_database(self._admin_url, self._template)

    def close(self) -> None:
        ahead, self._next = self._next, None
        self._pool.shutdown(wait=True)
        if ahead is not None and ahead.exception() is None:
            drop_database(self._admin_url, ahead.result())


@pytest.fixture(scope="session")
def _clones(pg_admin_url: str, template_db: str) -> Iterator[_Clones]:
    clones = _Clones(pg_admin_url, template_db)
    yield clones
    clones.close()


@pytest.fixture
def db_url(pg_admin_url: str, _clones: _Clones, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, migrated database for this test."""
    mark = request.node.get_closest_marker("serial")
    measuring = mark is not None and mark.kwargs["exclusive"]
    url = _clones.take(then_ahead=not measuring)
    yield url
    _clones.drop(url)
    _clones.ahead()


@pytest.fixture
def empty_db_url(pg_admin_url: str) -> Iterator[str]:
    """A fresh database with no schema at all."""
    url = create_database(pg_admin_url, None)
    yield url
    drop_database(pg_admin_url, url)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = sync_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
async def aengine(db_url: str) -> AsyncIterator[AsyncEngine]:
    eng = async_engine(db_url)
    yield eng
    await eng.dispose()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("POLLER_TEST_REDIS_URL")
    if external:
        yield external
        return
    with _server_dir("redis") as folder:
        server = EmbeddedRedis(folder)
        stop_at_exit(server, remove=folder)
        try:
            yield server.start()
        finally:
            server.stop()


def _broker(
    config: pytest.Config, kind: str, made: type[EmbeddedNats | EmbeddedRabbitMQ]
) -> tuple[EmbeddedNats | EmbeddedRabbitMQ, bool]:
    """The broker the run's workers share (and whether it is shared): the first to ask
    has it stopped when the run's controller ends (poller/service/server_watch.py)."""
    run = getattr(config, "workerinput", {}).get("testrunuid")
    if run is None:
        folder = Path(tempfile.gettempdir()) / f"poller-test-{kind}-{os.getpid()}"
    else:
        folder = Path(tempfile.gettempdir()) / f"poller-test-{kind}-{run}"
    folder.mkdir(exist_ok=True)
    server = made(folder)
    with _file_lock(folder / ".watched.lock"):
        if not (folder / ".watched").exists():
            stop_at_exit(server, remove=folder, pid=None if run is None else os.getppid())
            (folder / ".watched").touch()
    return server, run is not None


def _shared_broker(
    request: pytest.FixtureRequest, kind: str, made: type[EmbeddedNats | EmbeddedRabbitMQ]
) -> Iterator[str]:
    """A broker's URL: ``POLLER_TEST_{KIND}_URL``'s, else the run's embedded one, started
    by the first test that asks and stopped when the run ends."""
    external = os.environ.get(f"POLLER_TEST_{kind.upper()}_URL")
    if external:
        yield external
        return
    server, shared = _broker(request.config, kind, made)
    try:
        url = server.start()
    except EmbeddedServerError as exc:  # a broker test must not pass by not running
        pytest.fail(f"no {kind} broker here: {exc}")
    yield url
    if not shared:
        server.stop()
        shutil.rmtree(server.data_dir, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _rabbitmq_early(request: pytest.FixtureRequest) -> None:
    """RabbitMQ's boot takes seconds of CPU: when a test of this worker's will need it,
    begin it now, while other tests run, instead of blocking every worker on it later."""
    if os.environ.get("POLLER_TEST_RABBITMQ_URL"):
        return

    def needs(item: pytest.Item) -> bool:
        params = getattr(item, "callspec", None)
        where = params.params.get("where") if params is not None else None
        return "amqp_url" in item.fixturenames or where == "amqp"  # type: ignore[attr-defined]

    if any(needs(item) for item in request.session.items):
        with contextlib.suppress(EmbeddedServerError, OSError):
            server, _ = _broker(request.config, "rabbitmq", EmbeddedRabbitMQ)
            assert isinstance(server, EmbeddedRabbitMQ)
            server.launch()


@pytest.fixture(scope="session")
def nats_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A JetStream server (nats://127.0.0.1:PORT), shared by the run's workers."""
    yield from _shared_broker(request, "nats", EmbeddedNats)


@pytest.fixture(scope="session")
def amqp_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A RabbitMQ server (amqp://guest:guest@127.0.0.1:PORT/), shared by the run's workers."""
    yield from _shared_broker(request, "rabbitmq", EmbeddedRabbitMQ)


@pytest.fixture(autouse=True)
def _fresh_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tests see only the POLLER_ variables they set; private targets allowed (127.0.0.1)."""
    for name in list(os.environ):
        if name.startswith("POLLER_") and not name.startswith("POLLER_TEST_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("POLLER_ALLOW_PRIVATE_TARGETS", "true")
    default_settings.cache_clear()
    yield
    default_settings.cache_clear()


def make_endpoint(engine: Engine, name: str = "billing", **kwargs: object) -> CreatedEndpoint:
    url = str(kwargs.pop("url", f"http://127.0.0.1:9/{name}"))
    with engine.begin() as conn:
        return create_endpoint(conn, name, url, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def endpoint(engine: Engine) -> CreatedEndpoint:
    return make_endpoint(engine)


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent
