"""One place builds each process's configuration (issue 32, item 2): ``inturn ingest`` and
``inturn local`` share their serving options and build through ``IngestConfig.from_options``;
``inturn operator`` and ``kopf run`` build through ``OperatorConfig.from_options``."""

from __future__ import annotations

import inspect

import click
import pytest

from inturn.operator.config import OperatorConfig
from inturn.worker.cli.ingest import ingest_command
from inturn.worker.cli.local import local_command
from inturn.worker.cli.options import INGEST_ONLY, INGEST_SETTINGS
from inturn.worker.errors import Invalid, OptionInvalid
from inturn.worker.ingest.config import IngestConfig

SHARED = ("listen", "ops", "hold_unrouted", "accept_unrouted")


def options(command: click.Command) -> dict[str, click.Parameter]:
    return {p.name: p for p in command.params if p.name}


def test_ingest_and_local_declare_their_serving_options_once() -> None:
    ingest, local = options(ingest_command), options(local_command)
    for name in SHARED:
        assert isinstance(ingest[name], click.Option) and isinstance(local[name], click.Option)
        assert (ingest[name].opts, ingest[name].help) == (local[name].opts, local[name].help)
    assert ingest["listen"].required is False and local["listen"].required is True
    assert "authenticated" in (ingest["http"].help or "")
    assert "OPEN" in (local["http"].help or "")


def test_local_takes_every_ingest_setting_but_the_ones_it_refuses_on_purpose() -> None:
    """Issue 32 item 2: one place per option. ``inturn local`` once lacked
    ``--duplicate-delivered-window``; now every ingest option is local's too (the same
    declaration: flags, help, default, type), but the ones :data:`INGEST_ONLY` names, each
    with its reason; and each setting is a keyword of ``IngestConfig.from_options``."""
    ingest, local = options(ingest_command), options(local_command)
    missing = set(ingest) - set(local)
    assert (
        missing
        == set(INGEST_ONLY)
        == {
            "allow_network",
            "allow_subject",
            "http_credentials",
            "http_insecure",
            "tls_cert",
            "tls_key",
            "tls_client_ca",
            "pool_size",
        }
    )
    for name in (*SHARED, *INGEST_SETTINGS):
        a, b = ingest[name], local[name]
        assert (a.opts, a.help, a.default, type(a.type), a.envvar) == (
            b.opts,
            b.help,
            b.default,
            type(b.type),
            b.envvar,
        ), name
    assert local["duplicate_delivered_window"].opts == ["--duplicate-delivered-window"]
    assert local["refresh_seconds"].opts == ["--refresh"]
    keywords = set(inspect.signature(IngestConfig.from_options).parameters)
    assert set(INGEST_SETTINGS) <= keywords and set(INGEST_ONLY) <= keywords


def test_from_options_parses_what_a_person_writes() -> None:
    config = IngestConfig.from_options(
        listen=["adt=2575", "lab=127.0.0.1:2576"],
        http="[::1]:8080",
        http_insecure=True,
        ops="9090",
        max_frame_bytes="2M",
        memory_limit="1Gi",
        hold_unrouted=["adt"],
    )
    assert [(li.channel, li.host, li.port) for li in config.listeners] == [
        ("adt", "0.0.0.0", 2575),
        ("lab", "127.0.0.1", 2576),
    ]
    # the unauthenticated ops endpoints: this host only unless a host is given
    assert (config.http, config.ops) == (("::1", 8080), ("127.0.0.1", 9090))
    everywhere = IngestConfig.from_options(listen=["adt=2575"], ops="0.0.0.0:9090")
    assert everywhere.ops == ("0.0.0.0", 9090)
    assert (config.max_frame_bytes, config.memory_limit) == (2 * 2**20, 2**30)
    assert config.hold_unrouted == frozenset({"adt"})


@pytest.mark.parametrize(
    ("settings", "option", "words"),
    [
        ({}, None, "nothing to serve"),
        ({"listen": ["adt"]}, "--listen", "CHANNEL=[HOST:]PORT"),
        ({"listen": ["adt=99999"]}, "--listen", "between 0 and 65535"),
        ({"http": "8080"}, None, "--http needs --http-credentials"),
        ({"listen": ["adt=1"], "ops": "x:y"}, "--ops", "must be a number"),
        ({"listen": ["adt=1"], "tls_cert": "c.pem"}, None, "go together"),
        ({"listen": ["adt=1"], "max_frame_bytes": "lots"}, "--max-frame-bytes", "lots"),
        (
            {"listen": ["adt=1"], "hold_unrouted": ["adt"], "accept_unrouted": ["adt"]},
            "--hold-unrouted/--accept-unrouted",
            "both name adt",
        ),
        ({"listen": ["adt=1"], "memory_limit": "64Mi"}, None, "give ingest at least"),
    ],
)
def test_a_wrong_setting_is_named(
    settings: dict[str, object], option: str | None, words: str
) -> None:
    with pytest.raises(OptionInvalid, match=words.replace("[", r"\[").replace("]", r"\]")) as err:
        IngestConfig.from_options(**settings)  # type: ignore[arg-type]
    assert err.value.option == option


def test_the_operator_builds_the_same_from_the_environment_as_from_options() -> None:
    env = {
        "INTURN_WORKER_IMAGE": "registry.example/inturn:1",
        "INTURN_DSN": "postgresql://op@db/inturn",
        "INTURN_DSN_SECRET": "db",
        "INTURN_STATUS_INTERVAL": "30",
        "INTURN_WATCH_NAMESPACES": "ward, lab",
        "POD_NAME": "operator-0",
        "POD_NAMESPACE": "inturn",
    }
    from_env = OperatorConfig.from_env(env)
    from_options = OperatorConfig.from_options(
        image="registry.example/inturn:1",
        dsn="postgresql://op@db/inturn",
        dsn_secret="db",
        status_interval=30,
        namespaces=["ward,lab"],
        env=env,
    )
    assert from_env == from_options
    assert from_env.namespaces == ("ward", "lab")
    assert (from_env.identity, from_env.operator_namespace) == ("operator-0", "inturn")


def test_the_operator_names_what_is_missing_or_malformed() -> None:
    with pytest.raises(Invalid, match="worker image is required"):
        OperatorConfig.from_env({})
    with pytest.raises(Invalid, match="--worker-env"):
        OperatorConfig.from_options(image="i", worker_env=["NOEQUALS"])
