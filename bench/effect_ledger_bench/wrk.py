"""The wrk load generator: a Lua script that runs effect cycles, one executor per wrk thread.

wrk keeps Lua state per thread, not per connection, so each thread gets exactly one connection and
its state is that executor's state. Per-call latencies come from CLOCK_MONOTONIC through LuaJIT's FFI,
because wrk only reports one latency distribution for all calls.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path

from effect_ledger_bench.procs import children_cpu_seconds
from effect_ledger_bench.stats import LoadResult
from effect_ledger_bench.workload import LEASE_SECONDS, TOOL, TOOL_VERSION

SCRIPT = (
    r"""
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local clock = ffi.new("bench_timespec")
local function now_ms()
  ffi.C.clock_gettime(1, clock)  -- CLOCK_MONOTONIC
  return tonumber(clock.tv_sec) * 1000 + tonumber(clock.tv_nsec) / 1000000
end

local threads = {}
function setup(thread)
  thread:set("tid", #threads)
  table.insert(threads, thread)
end

local function read_lines(path)
  local out = {}
  if path == "-" then return out end
  for line in io.lines(path) do if #line > 0 then out[#out + 1] = line end end
  return out
end

function init(args)
  mode, prefix = args[1], args[2]
  local tokens = read_lines(args[3])
  ids = read_lines(args[4])
  hdrs = {["Content-Type"] = "application/json",
          ["Authorization"] = "Bearer " .. tokens[(tid % #tokens) + 1]}
  nonce = "bench-nonce-" .. prefix .. "-" .. string.format("%04d", tid)
  step, n, cycles, op, claim_token, sent = "claim", 0, 0, "", "", 0
  claim_ms, submit_ms, complete_ms, errors = {}, {}, {}, {}
  math.randomseed(tid + 1)
end

local function claim_request(id)
  return wrk.format("POST", "/v1/operations/" .. id .. "/claim", hdrs,
    '{"tool":"@TOOL@","tool_version":"@VERSION@","intent":{"op":"' .. id ..
    '","amount_cents":1250,"currency":"EUR"},"lease_seconds":@LEASE@,"client_nonce":"' .. nonce .. '"}')
end

function request()
  sent = now_ms()
  if mode == "replay" then
    op = ids[math.random(#ids)]
    return claim_request(op)
  elseif step == "claim" then
    n = n + 1
    op = prefix .. "-" .. tid .. "-" .. n
    return claim_request(op)
  elseif step == "submit" then
    return wrk.format("POST", "/v1/operations/" .. op .. "/submit", hdrs,
      '{"token":"' .. claim_token .. '","effect_ref":"ref-' .. op .. '"}')
  end
  return wrk.format("POST", "/v1/operations/" .. op .. "/complete", hdrs,
    '{"token":"' .. claim_token .. '","outcome":"committed","receipt":{"external_ref":"rcpt-' .. op .. '"}}')
end

local function miss(call, status)
  local key = call .. " " .. status
  errors[key] = (errors[key] or 0) + 1
end

function response(status, headers, body)
  local ms = now_ms() - sent
  if mode == "replay" then
    claim_ms[#claim_ms + 1] = ms
    if status ~= 200 then miss("claim", status) end
  elseif step == "claim" then
    claim_ms[#claim_ms + 1] = ms
    if status == 201 then
      claim_token = body:match('"token":"([^"]+)"')
      step = "submit"
    else
      miss("claim", status)
    end
  elseif step == "submit" then
    submit_ms[#submit_ms + 1] = ms
    if status == 200 then step = "complete" else miss("submit", status); step = "claim" end
  else
    complete_ms[#complete_ms + 1] = ms
    if status == 200 then cycles = cycles + 1 else miss("complete", status) end
    step = "claim"
  end
end

function done(summary, latency, requests)
  local parts = {}
  for _, t in ipairs(threads) do
    local errs = {}
    for key, count in pairs(t:get("errors")) do errs[#errs + 1] = string.format('"%s":%d', key, count) end
    parts[#parts + 1] = string.format(
      '{"cycles":%d,"claim":[%s],"submit":[%s],"complete":[%s],"errors":{%s}}',
      t:get("cycles"), table.concat(t:get("claim_ms"), ","), table.concat(t:get("submit_ms"), ","),
      table.concat(t:get("complete_ms"), ","), table.concat(errs, ","))
  end
  local e = summary.errors
  io.write(string.format(
    'BENCH_RESULT {"duration_us":%d,"requests":%d,"socket_errors":%d,"non2xx":%d,"threads":[%s]}\n',
    summary.duration, summary.requests, e.connect + e.read + e.write + e.timeout, e.status,
    table.concat(parts, ",")))
end
""".replace("@TOOL@", TOOL)
    .replace("@VERSION@", TOOL_VERSION)
    .replace("@LEASE@", str(LEASE_SECONDS))
)


def wrk_path() -> str | None:
    """wrk on PATH (Debian package `wrk`), or None."""
    return shutil.which("wrk")


def _parse(stdout: str) -> LoadResult:
    line = next((ln for ln in stdout.splitlines() if ln.startswith("BENCH_RESULT ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no result:\n{stdout[-2000:]}")
    data = json.loads(line.removeprefix("BENCH_RESULT "))
    result = LoadResult(window=data["duration_us"] / 1e6, generator="wrk")
    result.requests = int(data["requests"])
    if data["socket_errors"]:
        result.errors["socket"] = int(data["socket_errors"])
    for thread in data["threads"]:
        share = LoadResult(window=result.window, cycles=int(thread["cycles"]), errors=dict(thread["errors"]))
        share.calls = {call: [float(v) for v in thread[call]] for call in ("claim", "submit", "complete")}
        result.merge(share)
    result.calls = {call: samples for call, samples in result.calls.items() if samples}
    return result


async def wrk_load(
    mode: str,
    base_url: str,
    workdir: Path,
    tokens: list[str],
    executors: int,
    seconds: float,
    prefix: str,
    ids: list[str] | None = None,
) -> LoadResult:
    """Run wrk once (cycle or replay mode) and return what it measured, with its own CPU seconds."""
    binary = wrk_path()
    if binary is None:
        raise RuntimeError("wrk is not on PATH")
    token_file = workdir / f"{prefix}.tokens"
    token_file.write_text("\n".join(tokens) + "\n")
    id_file = "-"
    if ids:
        (workdir / f"{prefix}.ids").write_text("\n".join(ids) + "\n")
        id_file = str(workdir / f"{prefix}.ids")
    script = workdir / "bench.lua"
    script.write_text(SCRIPT)
    cpu_before = children_cpu_seconds()
    proc = await asyncio.create_subprocess_exec(
        binary,
        f"-t{executors}",
        f"-c{executors}",
        f"-d{max(1, math.ceil(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(script),
        base_url,
        "--",
        mode,
        prefix,
        str(token_file),
        id_file,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {err.decode(errors='replace')[-2000:]}")
    result = _parse(out.decode())
    result.generator_cpu = children_cpu_seconds() - cpu_before
    return result
