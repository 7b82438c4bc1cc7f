"""The registry of ``rkv`` subcommands: name -> (``"module:attr"`` of a click command, short
help). :mod:`rkv.cli` imports a command's module only when it runs, so the heavy modules
(torch, numba) stay out of ``rkv --help``. Add a command by adding its entry here (and to a
section); ``tests/test_cli_conventions.py`` checks that each short help matches its command.
"""

from __future__ import annotations

COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("rkv.cli.store:init_cmd", "create a store from an engine config (TOML)"),
    "info": ("rkv.cli.store:info_cmd",
             "show tiers, usage, blocks and model fingerprints"),
    "verify": ("rkv.cli.store:verify_cmd",
               "read and check every record; exit 1 if corrupt"),
    "scrub": ("rkv.cli.scrub:scrub_cmd",
              "patrol-scrub a store: correct, refresh, repair or drop blocks"),
    "serve-metrics": ("rkv.cli.metrics:serve_metrics_cmd",
                      "serve a store's Prometheus metrics over HTTP until interrupted"),
    "migrate": ("rkv.cli.store:migrate_cmd",
                "upgrade a store's index to the current format"),
    "destroy": ("rkv.cli.store:destroy_cmd",
                "delete a store and its tier files kept outside it"),
    "demo": ("rkv.cli.store:demo_cmd",
             "store and reload KV with shared prefixes; see a fault injected and caught"),
    "campaign": ("rkv.cli.campaign:campaign_cmd",
                 "fault-injection campaign through the real engine"),
    "validate": ("rkv.cli.campaign:validate_cmd",
                 "campaigns against the analytic model; exit 1 if a cell disagrees"),
    "faultmodels": ("rkv.cli.faultmodels:faultmodels_cmd",
                    "list the fault-model presets and their parameters"),
    "plan": ("rkv.cli.plan:plan_cmd",
             "print the placement plan of a put (tier, bits, code per block, and why)"),
    "quality": ("rkv.cli.quality:quality_cmd",
                "quality of KV through rkv on SmolLM2-135M (bits, faults, ECC)"),
    "calibrate": ("rkv.cli.calibrate:calibrate_cmd",
                  "quality profile of SmolLM2-135M: KL per layer's K and V at 8/4/2 bits"),
    "sweep": ("rkv.cli.sweep:sweep_cmd",
              "a quality-versus-reliability sweep; resumable, on a process pool or Ray"),
    "report": ("rkv.cli.report:report_cmd",
               "Pareto plots, markdown report and summary of a sweep's results"),
    "replay": ("rkv.cli.replay:replay_cmd",
               "replay a request trace through eviction policies (or --moe: experts)"),
    "moe": ("rkv.cli.moe:moe_group", "SmolLM2-135M as a mixture of experts (trace, run)"),
}

#: How ``rkv --help`` groups the commands.
SECTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Stores", ("init", "info", "verify", "scrub", "serve-metrics", "migrate", "destroy",
                "demo")),
    ("Reliability", ("campaign", "validate", "faultmodels", "plan")),
    ("Quality", ("quality", "calibrate", "sweep", "report")),
    ("Workloads", ("replay", "moe")),
)
