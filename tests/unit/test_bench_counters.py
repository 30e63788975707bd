"""bench's load accounting: the kernel's own work (interrupts, softirqs, kernel threads) is told apart
from other processes' load, so the quiet rule judges only the latter."""

from __future__ import annotations

import os
import time
from pathlib import Path

from effect_ledger_bench.counters import PF_KTHREAD, kernel_busy_seconds, kernel_thread_ticks


def _stat_line(command: str, flags: int, utime: int, stime: int) -> str:
    # pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime ...
    return f"4242 ({command}) S 2 0 0 0 -1 {flags} 0 0 0 0 {utime} {stime} 0 0 20 0 1 0 26 0 0"


def test_a_kernel_threads_ticks_count_and_a_process_does_not() -> None:
    assert kernel_thread_ticks(_stat_line("kworker/1:0H-kblockd", PF_KTHREAD | 0x40, 7, 5)) == 12
    assert kernel_thread_ticks(_stat_line("postgres", 0x400140, 7, 5)) == 0


def test_a_command_with_spaces_and_parentheses_is_read_past() -> None:
    assert kernel_thread_ticks(_stat_line("odd ) name (x) 9 9", PF_KTHREAD, 3, 4)) == 7
    assert kernel_thread_ticks(_stat_line("odd ) name (x) 9 9", 0, 3, 4)) == 0


def test_the_real_kthreadd_is_a_kernel_thread_and_this_process_is_not() -> None:
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:  # some CPU of our own, so its ticks are not zero
        pass
    own = Path("/proc/self/stat").read_text()
    assert int(own[own.rindex(")") + 2 :].split()[11]) > 0
    assert kernel_thread_ticks(own) == 0
    kthreadd = Path("/proc/2/stat").read_text()
    assert "(kthreadd)" in kthreadd and int(kthreadd.split()[8]) & PF_KTHREAD
    fields = kthreadd.split()
    assert kernel_thread_ticks(kthreadd) == int(fields[13]) + int(fields[14])


def test_the_kernels_share_holds_interrupt_time_and_not_a_process_cpu() -> None:
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    irq = (int(fields[6]) + int(fields[7])) / os.sysconf("SC_CLK_TCK")
    first = kernel_busy_seconds()
    assert first >= irq  # interrupts and softirqs, read after them
    start = time.process_time()
    while time.process_time() - start < 0.4:  # 0.4 s of this (user) process's CPU
        pass
    # none of it is the kernel's: the kernel's share grew by far less than what this process burnt
    assert kernel_busy_seconds() - first < 0.2
