"""Reading a pool's cgroup pressure (PSI) from recorded files: what the kernel writes, where systemd puts it."""

from __future__ import annotations

import pathlib

from flexiqd.daemon.pressure import PressureReader, parse_pressure, unified_mount, unified_path

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
    assert parse_pressure(CPU) == {"some": 96.87, "full": 0.0}
    assert parse_pressure("some avg10=12.50 avg60=1 avg300=0 total=1\n") == {"some": 12.5}
    assert parse_pressure("") == {}
    assert parse_pressure("garbage\nsome avg10=x\n") == {}


def test_the_unified_hierarchy_is_found_where_it_is_mounted_and_a_worker_in_it():
    assert unified_mount(MOUNTINFO_HYBRID) == "/sys/fs/cgroup/unified"
    assert unified_mount("30 24 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n") == "/sys/fs/cgroup"
    assert unified_mount(MOUNTINFO_V1) is None
    assert unified_path(PROC_CGROUP) == "/system.slice/flexiq-worker@default-1.service"
    assert unified_path("1:cpu:/\n") is None


def _host(tmp: pathlib.Path, mountinfo: str, workers: dict[int, dict[str, str]]) -> PressureReader:
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
    return PressureReader(proc=str(proc))


def test_a_pools_pressure_is_the_mean_of_its_workers_that_could_be_read(tmp_path):
    reader = _host(tmp_path, MOUNTINFO_HYBRID, {
        11: {"cpu": CPU, "io": IO},
        12: {"cpu": "some avg10=3.13 avg60=0 avg300=0 total=1\nfull avg10=0.00 avg60=0 avg300=0 total=0\n"},
    })
    found = reader.pool([11, 12, 99], ["cpu", "io", "memory"])  # 99: gone since the listing
    assert abs(found["cpu"] - (96.87 + 3.13) / 2) < 1e-9
    assert found["io"] == 2.17          # the only worker whose file exists
    assert found["memory"] is None      # no information, not "no pressure"


def test_a_host_without_the_unified_hierarchy_gives_no_reading(tmp_path):
    reader = _host(tmp_path, MOUNTINFO_V1, {11: {"cpu": CPU}})
    assert reader.pool([11], ["cpu"]) == {"cpu": None}
    assert reader.pool([], ["cpu"]) == {"cpu": None}
