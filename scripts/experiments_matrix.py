"""The experiment matrices (full, and the small one CI runs) and the CSV columns."""

MIB = 1 << 20


def mislead_cases(unit):
    """(case, non-zero pages the workload leaves, workload, what it does), for
    blocks of `unit` bytes; sparse cases spread over 4 units."""
    u, pages = unit, unit // 4096
    return [
        ("dense", pages, "touch size=%d" % u, "every page written non-zero (control)"),
        ("zero-fill", 0, "touch-zero size=%d" % u, "pages written with zeros"),
        ("read-only", 0, "read size=%d" % u, "pages only read"),
        ("zeroed-after-use", 0, "touch size=%d; touch-zero size=%d" % (u, u),
         "written then zeroed again (a guest that zeroes freed memory)"),
        ("half-zero", pages // 2, "touch size=%d; touch-zero offset=%d size=%d" % (u // 2, u // 2, u // 2),
         "half the pages non-zero and half written with zeros"),
        ("sparse-64K", 4 * u // (64 << 10), "touch size=%d stride=16" % (4 * u), "one page written per 64 KiB"),
        ("sparse-2M", 4 * u // (2 * MIB), "touch size=%d stride=512" % (4 * u), "one page written per 2 MiB"),
    ]


# Migration cells: (memory, vCPUs, hugepages, write, fraction, dirty, link, downtime limit ms);
# dirty is 0, slow, near (0.9x of a 1 Gbit/s link's page rate) or above (every vCPU
# but the first at full speed); see experiments_migration.py.
# Throttled migration cells (experiments_converge.py): (shape, dirty log, --converge).
CONVERGE_FULL = [(shape, "ring", how) for shape in ("sweep", "random", "two-writers")
                 for how in ("auto", "dirty-limit", "auto-converge")] + [("sweep", "bitmap", "auto"),
                                                                         ("reader-only", "ring", "off")]

MIGRATION_FULL = [
    ("256M", 1, False, "nonzero", 0.5, "0", "unlimited", 300),
    ("256M", 1, True, "nonzero", 0.5, "0", "1Gbit", 300),
    ("512M", 1, False, "zero", 0.5, "0", "1Gbit", 30),
    ("1G", 1, False, "nonzero", 0.25, "0", "10Gbit", 300),
    ("2G", 1, False, "nonzero", 0.1, "0", "unlimited", 30),
    ("2G", 4, True, "nonzero", 0.25, "0", "10Gbit", 30),
    ("16G", 1, False, "nonzero", 0.0, "0", "unlimited", 300),
    ("512M", 1, False, "nonzero", 0.25, "slow", "1Gbit", 300),
    ("512M", 4, False, "nonzero", 0.25, "slow", "10Gbit", 30),
    ("1G", 1, False, "nonzero", 0.25, "slow", "unlimited", 30),
    ("256M", 1, False, "zero", 0.5, "slow", "1Gbit", 30),
    ("1G", 4, False, "nonzero", 0.5, "slow", "1Gbit", 300),
    ("512M", 1, False, "nonzero", 0.25, "near", "1Gbit", 300),
    ("512M", 4, True, "nonzero", 0.25, "near", "1Gbit", 30),
    ("512M", 4, False, "nonzero", 0.25, "above", "1Gbit", 300),
    ("512M", 4, False, "nonzero", 0.25, "above", "1Gbit", 30),
]

MIGRATION_SMALL = [
    ("64M", 1, False, "nonzero", 0.25, "0", "unlimited", 300),
    ("64M", 1, True, "zero", 0.5, "0", "1Gbit", 30),
    ("128M", 2, False, "nonzero", 0.25, "slow", "1Gbit", 300),
    ("1G", 1, False, "nonzero", 0.0, "0", "unlimited", 300),
]

FULL = {
    "sizes": ["256M", "1G", "4G"],
    "fractions": [0.01, 0.1, 0.5, 1.0],
    "dirty_logs": [None, "bitmap"],  # only a bitmap VM keeps a log from boot
    "cost_sizes": ["256M", "1G", "4G", "16G"],
    "cost_touched": ["64M", "25%"],
    "cost_repeats": 5,
    "dirty_memory": "512M",
    "working_sets": [4 * MIB, 64 * MIB, 256 * MIB],
    "rates": [500, 2000, 8000],
    "dirty_repeats": 3,
    "calc_time": 1.0,
    "observer_ws": [4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB],
    "observer_modes": ["off", "bitmap", "ring", "ring:65536"],
    "observer_seconds": 1.0,
    "series_ws": 256 * MIB,
    "series_seconds": 3.0,
    "misleads_memory": "512M",
    "cases": mislead_cases(64 * MIB),
    "migration_cells": MIGRATION_FULL,
    "migration_ws": 128 * MIB,
    # Longer than any cell's readiness window, scan and migration (a
    # writer "above" the link runs 4 forced passes, about 6.5 s): with 6 s
    # a writer could end during the last passes and its cell converge.
    "migration_dirty_s": 30,
    "published_cells": ["idle", "slow", "near", "above", "sweeps", "idle", "slow", "near", "above", "sweeps",
                        "phases", "bursts", "phases", "bursts", "phases", "bursts"],
    "published_memory": "256M",
    "published_ws": 64 * MIB,
    "published_every_s": 3.0,
    "published_window_s": 1.0,
    "converge_cells": CONVERGE_FULL,
    "converge_memory": "256M",
    "converge_ws": 96 * MIB,
    "converge_repeats": 20000,
    "converge_lead": 2.0,
    "converge_link": "100MB/s",
    "converge_limit_ms": 300,
    "stall_modes": ["bitmap", "ring"],
    "stall_windows": [0.5, 2.0],
    "stall_memory": "256M",
    "stall_ws": 64 * MIB,
    "stall_large_ws": 512 * MIB,
    "stall_four_windows": [0.5, 2.0],
    "stall_seconds": 5.0,
    "stall_lead": 1.0,
    "stall_repeats": 3,
    "stall_migrations": [(mode, name) for mode in ("bitmap", "ring")
                         for name in ("random-max", "random-max-large", "random-paced")],
}

SMALL = {
    "sizes": ["64M"],
    "fractions": [0.25, 1.0],
    "dirty_logs": [None, "bitmap"],  # only a bitmap VM keeps a log from boot
    "cost_sizes": ["64M", "256M"],
    "cost_touched": ["16M"],
    "cost_repeats": 2,
    "dirty_memory": "128M",
    "working_sets": [16 * MIB],
    "rates": [2000],
    "dirty_repeats": 1,
    "calc_time": 1.0,
    "observer_ws": [16 * MIB],
    "observer_modes": ["off", "bitmap", "ring", "ring:65536"],
    "observer_seconds": 0.5,
    "series_ws": 16 * MIB,
    "series_seconds": 1.5,
    "misleads_memory": "128M",
    "cases": mislead_cases(16 * MIB),
    "migration_cells": MIGRATION_SMALL,
    "migration_ws": 16 * MIB,
    "migration_dirty_s": 3,
    "published_cells": ["slow"],
    "published_memory": "64M",
    "published_ws": 8 * MIB,
    "published_every_s": 1.0,
    "published_window_s": 0.5,
    "converge_cells": [("random", "ring", "auto")],
    "converge_memory": "96M",
    "converge_ws": 24 * MIB,
    "converge_repeats": 4000,
    "converge_lead": 1.0,
    "converge_link": "20MB/s",
    "converge_limit_ms": 300,
    "stall_modes": ["ring"],
    "stall_windows": [0.5],
    "stall_memory": "64M",
    "stall_ws": 16 * MIB,
    "stall_seconds": 1.5,
    "stall_lead": 0.4,
}

# Figures shared by estimates and misleads rows (see experiments.estimate_fields).
_ESTIMATE = [
    "ram_pages", "mapped_pages", "mapped_4k", "mapped_2m", "resident_pages", "written_pages",
    "sampled_pages", "sampled_read",
    "scan_nonzero", "scan_nonzero_arena", "scan_zero", "scan_unbacked",
    "mapped_ratio", "resident_ratio", "written_ratio", "sampled_ratio",
    "mapped_us", "resident_us", "written_us", "sampled_us", "scan_us",
]

from experiments_converge import COLUMNS as _CONVERGE  # noqa: E402
from experiments_migration import COLUMNS as _MIGRATION  # noqa: E402
from experiments_published import COLUMNS as _PUBLISHED  # noqa: E402
from experiments_stall import COLUMNS as _STALL  # noqa: E402

COLUMNS = {
    "migration": _MIGRATION,
    "converge": _CONVERGE,
    "published": _PUBLISHED,
    "stall": _STALL,
    "estimates": ["memory", "memory_bytes", "hugepages", "dirty_log", "write", "fraction", "arena_pages",
                  "touched_pages", "nonzero_written", "touch_s"] + _ESTIMATE,
    "cost": ["memory", "memory_bytes", "dirty_log", "touched", "fill", "touched_pages", "repeats", "mapped_us",
             "mincore_us", "scan_us", "scan_first_us", "sync_first_us", "sync_idle_us", "resident_pages",
             "scan_nonzero", "scan_gb_per_s"],
    "dirtyrate": ["kind", "mode", "rate", "ws_bytes", "ws_pages", "seed", "window_s", "measured_pages", "measured_rate",
                  "raw_expected_pages", "expected_pages", "expected_rate", "ratio_expected", "ratio_raw",
                  "guest_writes", "guest_seconds", "guest_distinct", "guest_rate", "ratio_guest", "took_us"],
    "observer": ["mode", "ws_bytes", "ws_pages", "seconds", "before_rate", "during_rate", "after_rate",
                 "guest_distinct", "measured_pages", "ratio_guest", "window_s"],
    "misleads": ["case", "what", "workload", "hugepages", "dirty_log", "nonzero_written", "estimate_used"] + _ESTIMATE
                + ["mapped_excess_mib", "resident_excess_mib", "written_excess_mib", "sampled_excess_mib"],
}
