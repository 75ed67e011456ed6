"""The charts of bench's reports: a gnuplot script written beside the PNG,
run, then removed with the data files it plotted."""

import os
import subprocess


def draw(base, lines, data_files):
    """Writes BASE.gp from LINES, runs gnuplot on it, removes it and
    DATA_FILES."""
    with open(base + ".gp", "w") as f:
        f.write("\n".join(lines) + "\n")
    subprocess.run(["gnuplot", base + ".gp"], check=True)
    for path in data_files:
        os.remove(path)
    os.remove(base + ".gp")
