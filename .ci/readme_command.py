"""Print the README's set-up command number N (1: install and analyse, 2: install test extras and test).

CI runs exactly what the README tells a new user to run, so the two cannot drift apart.
"""

import re
import sys
from pathlib import Path

readme = Path(__file__).resolve().parents[1] / "README.md"
setup = readme.read_text(encoding="utf-8").split("## Set-up", 1)[1].split("\n## ", 1)[0]
blocks = re.findall(r"```bash\n(.*?)\n```", setup, flags=re.DOTALL)
print(blocks[int(sys.argv[1]) - 1].strip())
