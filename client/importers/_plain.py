"""Plain files whose names carry a step (`model_1000.pt`, `step-500.safetensors`,
`ckpt.iter=20.pth`): the files of one step become one checkpoint (`model_1000.pt` and
`optim_1000.pt` together), under their own names. Files without a number in their name
are reported and left out; hidden files are not looked at.
"""

from __future__ import annotations

from ._entries import Entry, SourcePath, problem_in, step_in


def _files(root: SourcePath) -> list[SourcePath]:
    return sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith("."))


def matches(root: SourcePath) -> bool:
    return any(step_in(p.name) is not None for p in _files(root))


def scan(root: SourcePath) -> list[Entry]:
    by_step: dict[int, dict[str, SourcePath]] = {}
    entries = []
    for path in _files(root):
        step = step_in(path.name)
        if step is None:
            entries.append(
                Entry(path.name, -1, "", {}, problem=f"{path.name}: no step in its name")
            )
        else:
            by_step.setdefault(step, {})[path.name] = path
    for step, files in sorted(by_step.items()):
        entry = Entry(f"step-{step}", step, "", files, metadata={"step": step})
        entry.problem = problem_in(files)
        entries.append(entry)
    return entries
