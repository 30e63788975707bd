"""The MCP gateway's pure parts: operation IDs (API.md section 16), the policy decision, the config file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from effect_ledger_mcp.config import ConfigError, parse_config
from effect_ledger_mcp.identity import InvalidOperationId, derive_operation_id, identify, tool_version


def _config(policy: dict[str, object]) -> bytes:
    return json.dumps(
        {
            "ledger": {"url": "http://l", "token_file": "t"},
            "mcpServers": {"s": {"url": "http://u"}},
            "policy": policy,
        }
    ).encode()


def test_the_derived_operation_id_is_the_first_48_hex_of_the_jcs_digest() -> None:
    # JCS of this document is the compact, key-sorted JSON (ASCII strings and small integers).
    document = {"arguments": {"amount": 5, "to": "x"}, "run": "r1", "server": "pay", "tool": "charge"}
    expected = "mcp-" + hashlib.sha256(json.dumps(document, separators=(",", ":")).encode()).hexdigest()[:48]
    assert derive_operation_id("r1", "pay", "charge", {"to": "x", "amount": 5}) == expected
    assert derive_operation_id(None, "pay", "charge", {"amount": 5}) != derive_operation_id(
        "r1", "pay", "charge", {"amount": 5}
    )


def test_volatile_and_injected_arguments_are_left_out_and_the_injected_value_follows_the_id() -> None:
    common = {
        "server": "pay",
        "tool": "charge",
        "config_run_id": "r1",
        "left_out": frozenset({"note", "key"}),
    }
    inject = {"key": "el-{operation_id}"}
    one = identify(arguments={"amount": 5, "note": "a", "key": "k1"}, meta=None, inject=inject, **common)
    two = identify(arguments={"amount": 5, "note": "b", "key": "k2"}, meta={}, inject=inject, **common)
    assert one.operation_id == two.operation_id == derive_operation_id("r1", "pay", "charge", {"amount": 5})
    assert one.intent == {"amount": 5} and one.derived
    assert one.forwarded == {"amount": 5, "note": "a", "key": f"el-{one.operation_id}"}
    assert one.effect_ref == f"el-{one.operation_id}"
    # The run comes from the host's _meta before the config; the operation ID from _meta before both.
    other_run = identify(arguments={"amount": 5}, meta={"effect-ledger/run_id": "r2"}, inject={}, **common)
    assert other_run.operation_id == derive_operation_id("r2", "pay", "charge", {"amount": 5})
    explicit = identify(
        arguments={"amount": 5}, meta={"effect-ledger/operation_id": "op-1"}, inject={}, **common
    )
    assert explicit.operation_id == "op-1" and not explicit.derived
    # An argument that looks like the meta key is only an argument.
    spoof = identify(
        arguments={"amount": 5, "effect-ledger/operation_id": "op-1"}, meta=None, inject={}, **common
    )
    assert spoof.operation_id.startswith("mcp-")
    with pytest.raises(InvalidOperationId):
        identify(arguments={}, meta={"effect-ledger/operation_id": "a b"}, inject={}, **common)


def test_the_tool_version_is_the_digest_of_the_input_schema() -> None:
    schema = {"type": "object", "properties": {"amount": {"type": "integer"}}}
    compact = json.dumps(schema, separators=(",", ":"), sort_keys=True).encode()
    assert tool_version(schema) == "sha256:" + hashlib.sha256(compact).hexdigest()


def test_the_policy_takes_an_exact_name_then_the_first_glob_in_file_order_then_the_default() -> None:
    config = parse_config(
        _config(
            {
                "default": "pass",
                "tools": {
                    "s__read*": {"mode": "pass"},
                    "s__*": {"mode": "wrap", "volatile": ["n"], "timeout_seconds": 5},
                    "s__readonly_but_wrapped": {"mode": "wrap"},
                    "s__danger": {"mode": "deny"},
                    "s__defaulted": {"volatile": ["x"]},
                },
            }
        ),
        Path("/cfg"),
    )
    assert config.decide("s__read_file").mode == "pass"
    assert config.decide("s__readonly_but_wrapped").mode == "wrap"  # the exact key beats the earlier glob
    assert config.decide("s__danger").mode == "deny"
    decided = config.decide("s__charge")
    assert (decided.mode, decided.volatile, decided.timeout_seconds, decided.rule) == (
        "wrap",
        {"n"},
        5,
        "s__*",
    )
    assert config.decide("s__defaulted").mode == "pass"  # a rule without a mode takes the default
    assert config.decide("other__tool").mode == "pass" and config.decide("other__tool").rule is None
    assert config.token_path() == Path("/cfg/t")


@pytest.mark.parametrize(
    ("document", "reason"),
    [
        (b"{", "not JSON"),
        (b'{"ledger": {"url": "u"}, "mcpServers": {"a__b": {"url": "u"}}}', "not a usable server name"),
        (b'{"ledger": {"url": "u"}, "mcpServers": {"a": {"url": "u", "command": "c"}}}', "exactly one of"),
        (b'{"ledger": {"url": "u"}, "mcpServers": {"effect_ledger": {"url": "u"}}}', "reserved"),
        (b'{"ledger": {"url": "u"}, "mcpServers": {"a": {"command": "c", "bogus": 1}}}', "bogus"),
        (
            b'{"ledger": {"url": "u"}, "mcpServers": {}, "policy": {"tools": {"*": {"mode": "maybe"}}}}',
            "mode",
        ),
        (
            b'{"ledger": {"url": "u"}, "mcpServers": {}, "policy": {"tools": {"*": {"inject": {"k": "x"}}}}}',
            "{operation_id}",
        ),
        (
            b'{"ledger": {"url": "u"}, "mcpServers": {}, "policy": {"tools": {"*": {"timeout_seconds": 0}}}}',
            "timeout_seconds",
        ),
    ],
)
def test_an_unusable_configuration_says_why(document: bytes, reason: str) -> None:
    with pytest.raises(ConfigError, match=reason.replace("{", r"\{").replace("}", r"\}")):
        parse_config(document, Path("."))
