"""Stand-ins for docs/configuration.md's ``aprof.verl.load``: a verl trainer config's profiler
keys (verl's names; the rest of verl's config plays no part) as verl would run them. Neither
verl nor OmegaConf is needed."""

cfg = {
    "global_profiler": {"tool": "torch", "steps": [1, 2], "save_path": "outputs/profile"},
    "actor_rollout_ref": {
        "actor": {
            "profiler": {
                "tool": "torch",
                "enable": True,
                "all_ranks": False,
                "ranks": [0],
                "tool_config": {"torch": {"discrete": True}},
            }
        },
        "rollout": {"profiler": {"tool": "torch", "enable": True, "ranks": [0]}},
    },
}
