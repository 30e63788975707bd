"""Drive executors against the running service: wrk when it is installed, else Python processes."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from effect_ledger_bench.loadgen import Spec
from effect_ledger_bench.stats import LoadResult
from effect_ledger_bench.wrk import wrk_load, wrk_path

START_MARGIN = 1.0  # seconds for the generator processes to start before the common clock begins


@dataclass
class Generator:
    """Which generator runs the HTTP load, against which service, with which executor tokens."""

    host: str
    port: int
    tokens: list[str]  # one per executor, enough for the largest phase
    workdir: Path
    kind: str = "auto"  # auto | wrk | python
    processes: int = field(default_factory=lambda: max(2, min(4, os.cpu_count() or 2)))

    @property
    def uses_wrk(self) -> bool:
        """Whether cycles and replays go through wrk."""
        if self.kind == "wrk" and wrk_path() is None:
            raise RuntimeError("--generator wrk, but wrk is not on PATH (apt-get install wrk)")
        return self.kind == "wrk" or (self.kind == "auto" and wrk_path() is not None)

    @property
    def base_url(self) -> str:
        """The service's URL."""
        return f"http://{self.host}:{self.port}"

    async def cycles(self, executors: int, warmup: float, duration: float, prefix: str) -> LoadResult:
        """Full effect cycles by `executors` concurrent executors, measured after a warm-up."""
        if self.uses_wrk:
            if warmup > 0:
                await self._wrk("cycle", executors, warmup, f"{prefix}w")
            return await self._wrk("cycle", executors, duration, prefix)
        return await self._python("cycle", executors, warmup, duration, prefix, [])

    async def replays(self, executors: int, duration: float, prefix: str, ids: list[str]) -> LoadResult:
        """Claims of already committed IDs (each answered with the stored receipt)."""
        if self.uses_wrk:
            return await self._wrk("replay", executors, duration, prefix, ids)
        return await self._python("replay", executors, 0.0, duration, prefix, ids)

    async def contention(self, executors: int, hot_ids: list[str]) -> LoadResult:
        """Every executor claims every hot ID in the same order; the answers per ID are returned.

        Always the Python generator: it must know which executor got which answer for which ID.
        """
        return await self._python("contention", executors, 0.0, 0.0, "hot", hot_ids)

    async def flood(self, tokens: list[str], connections: int, duration: float, prefix: str) -> LoadResult:
        """Claims of new IDs back to back on `connections` keep-alive connections (tokens[0] for all),
        from one generator process, for `duration` seconds; the answers by status in outcomes["flood"]."""
        spec = Spec(
            "flood",
            self.host,
            self.port,
            [tokens[0]] * connections,
            0,
            time.time() + START_MARGIN,
            0.0,
            duration,
            prefix,
            [],
        )
        part = await _run_process(spec, duration + 120)
        return LoadResult(
            window=part["window"],
            requests=part["requests"],
            generator_cpu=part["generator_cpu"],
            outcomes=part["outcomes"],
            generator="python x1",
        )

    async def _wrk(
        self, mode: str, executors: int, seconds: float, prefix: str, ids: list[str] | None = None
    ) -> LoadResult:
        return await wrk_load(mode, self.base_url, self.workdir, self.tokens, executors, seconds, prefix, ids)

    async def _python(
        self, mode: str, executors: int, warmup: float, duration: float, prefix: str, ids: list[str]
    ) -> LoadResult:
        if executors > len(self.tokens):
            raise ValueError("more executors than tokens")
        processes = max(1, min(self.processes, executors))
        start_at = time.time() + START_MARGIN
        bounds = [executors * i // processes for i in range(processes + 1)]
        shares = [range(bounds[i], bounds[i + 1]) for i in range(processes)]
        specs = [
            Spec(
                mode,
                self.host,
                self.port,
                [self.tokens[e] for e in share],
                share.start,
                start_at,
                warmup,
                duration,
                prefix,
                ids,
            )
            for share in shares
            if share
        ]
        results = await asyncio.gather(*(_run_process(spec, warmup + duration + 120) for spec in specs))
        total = LoadResult(window=0.0, generator=f"python x{len(specs)}")
        for part in results:
            total.merge(
                LoadResult(
                    window=part["window"],
                    cycles=part["cycles"],
                    requests=part["requests"],
                    calls=part["calls"],
                    errors=part["errors"],
                    generator_cpu=part["generator_cpu"],
                    outcomes=part["outcomes"],
                )
            )
        return total


async def _run_process(spec: Spec, within: float) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "effect_ledger_bench.loadgen",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(msgspec.json.encode(spec)), within)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed: {err.decode(errors='replace')[-2000:]}")
    result: dict[str, Any] = msgspec.json.decode(out)
    return result
