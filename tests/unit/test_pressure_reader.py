"""Reading a pool's cgroup pressure (PSI) from recorded files: what the kernel writes, where systemd puts it."""

from __future__ import annotations

import pathlib

from flexiqd.daemon.pressure import PressureReader, parse_pressure, stalled_share, unified_mount, unified_path

# Recorded on a development machine (Linux 6.18, cgroup v1 beside v2's unified hierarchy).
CPU = ("some avg10=96.87 avg60=96.09 avg300=93.72 total=8023591694\n"
       "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
IO = ("some avg10=2.17 avg60=1.27 avg300=1.23 total=146194720\n"
      "full avg10=0.00 avg60=0.00 avg300=0.00 total=62839237\n")
MOUNTINFO_HYBRID = (
    "35 24 0:30 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "36 35 0:31 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
MOUNTINFO_V1 = "36 35 0:31 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
PROC_CGROUP = ("9:name=systemd:/system.slice/flexiq-worker@default-1.service\n"
               "1:cpu:/\n"
               "0::/system.slice/flexiq-worker@default-1.service\n")


def test_the_files_are_parsed_as_the_kernel_writes_them():
    assert parse_pressure(CPU) == {"some": 96.87, "some_total": 8023591694.0, "full": 0.0, "full_total": 0.0}
    assert parse_pressure("some avg10=12.50 avg60=1 avg300=0 total=1\n") == {"some": 12.5, "some_total": 1.0}
    assert parse_pressure("") == {}
    assert parse_pressure("garbage\nsome avg10=x\n") == {}


def test_the_unified_hierarchy_is_found_where_it_is_mounted_and_a_worker_in_it():
    assert unified_mount(MOUNTINFO_HYBRID) == "/sys/fs/cgroup/unified"
    assert unified_mount("30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n") == "/sys/fs/cgroup"
    assert unified_mount(MOUNTINFO_V1) is None
    assert unified_path(PROC_CGROUP) == "/system.slice/flexiq-worker@default-1.service"
    assert unified_path("1:cpu:/\n") is None


def test_the_share_stalled_is_the_totals_growth_over_the_time_between_reads():
    assert stalled_share((1_000_000.0, 10.0), (1_500_000.0, 11.0)) == 50.0
    assert stalled_share((0.0, 10.0), (3_000_000.0, 11.0)) == 100.0   # more than the time: several tasks
    assert stalled_share((5.0, 10.0), (1.0, 11.0)) is None   # the counter went back: a new cgroup
    assert stalled_share((5.0, 10.0), (9.0, 10.0)) is None   # no time passed


def _pressure(total_us: float, avg10: float = 0.0) -> str:
    return (f"some avg10={avg10:.2f} avg60=0.00 avg300=0.00 total={total_us:.0f}\n"
            f"full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")


def _host(tmp: pathlib.Path, mountinfo: str, workers: dict[int, dict[str, str]], clock=None) -> PressureReader:
    """A /proc and a cgroup tree with ``workers``: pid -> {resource: file text} (a file left out: absent)."""
    proc, mount = tmp / "proc", tmp / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(mountinfo.replace("/sys/fs/cgroup/unified", str(mount)))
    for pid, files in workers.items():
        unit = f"flexiq-worker@default-{pid}.service"
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "cgroup").write_text(f"1:cpu:/\n0::/system.slice/{unit}\n")
        folder = mount / "system.slice" / unit
        folder.mkdir(parents=True)
        for resource, text in files.items():
            (folder / f"{resource}.pressure").write_text(text)
    return PressureReader(proc=str(proc), **({"clock": clock} if clock else {}))


def _rewrite(tmp: pathlib.Path, pid: int, resource: str, text: str) -> None:
    (tmp / "cgroup" / "system.slice" / f"flexiq-worker@default-{pid}.service" / f"{resource}.pressure").write_text(text)


def test_a_pools_pressure_is_the_mean_of_its_workers_read_twice(tmp_path):
    now = [100.0]
    reader = _host(tmp_path, MOUNTINFO_HYBRID, {11: {"cpu": _pressure(0), "io": IO}, 12: {"cpu": _pressure(0)}},
                   clock=lambda: now[0])
    # The first read has nothing to measure against: no information yet.
    assert reader.pool([11, 12, 99], ["cpu", "io", "memory"]) == {"cpu": None, "io": None, "memory": None}
    now[0] = 102.0
    _rewrite(tmp_path, 11, "cpu", _pressure(1_800_000))   # 1.8 s of 2 s stalled: 90 %
    _rewrite(tmp_path, 12, "cpu", _pressure(200_000))     # 10 %
    found = reader.pool([11, 12, 99], ["cpu", "io", "memory"])  # 99: gone since the listing
    assert abs(found["cpu"] - 50.0) < 1e-9
    assert found["io"] == 0.0          # its total did not grow: no stall, a reading all the same
    assert found["memory"] is None     # no file: no information, not "no pressure"
    # A worker no longer listed is forgotten; listed again, it starts afresh.
    now[0] = 103.0
    assert reader.pool([11], ["cpu"]) == {"cpu": 0.0}
    assert (12, "cpu") not in reader._last


def test_a_host_without_the_unified_hierarchy_gives_no_reading(tmp_path):
    reader = _host(tmp_path, MOUNTINFO_V1, {11: {"cpu": CPU}})
    assert reader.pool([11], ["cpu"]) == {"cpu": None}
    assert reader.pool([], ["cpu"]) == {"cpu": None}
