"""Print a pip constraints file pinning every declared dependency to its floor (`>=X` becomes `==X`).

CI installs the project against it, so a floor that lies (a version that no longer works) fails CI.
torch and ray are left to the README's pins: their floor wheels are multi-GB CUDA builds.
"""

import re
import sys
import tomllib
from pathlib import Path

LEFT_TO_THE_README = {"torch", "ray"}

project = tomllib.loads(Path(sys.argv[1] if len(sys.argv) > 1 else "pyproject.toml").read_text())["project"]
requirements = list(project["dependencies"])
for extra in project.get("optional-dependencies", {}).values():
    requirements += extra
for requirement in requirements:
    match = re.match(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*>=\s*([^,;\s]+)", requirement)
    if match and match.group(1).lower() not in LEFT_TO_THE_README:
        print(f"{match.group(1)}=={match.group(2)}")
