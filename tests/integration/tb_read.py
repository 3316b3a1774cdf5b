"""TensorBoard's own reader on what ctrain writes: the run directories' scalars, histograms,
text and graph, the HTML its Text dashboard makes, the graph events per run.

TensorBoard is a pip package in the test virtual environment that scripts/test.sh makes; the
checks run under this interpreter (never skipped: without it they fail)."""
import json
import subprocess
import sys


def tb_python():
    if subprocess.run([sys.executable, "-c", "import tensorboard"],
                      capture_output=True).returncode != 0:
        raise AssertionError(f"{sys.executable} has no tensorboard package: run the tests with "
                             "scripts/test.sh (it makes a virtual environment with it)")
    return sys.executable


READ = r"""
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
out = {}
for run in sys.argv[1:]:
    acc = ea.EventAccumulator(run, size_guidance={ea.SCALARS: 0, ea.HISTOGRAMS: 0,
                                                  ea.TENSORS: 0, ea.GRAPH: 1})
    acc.Reload()
    tags = acc.Tags()
    r = {"scalars": {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]},
         "histograms": {t: [[e.step, e.histogram_value.num, e.histogram_value.min,
                             e.histogram_value.max] for e in acc.Histograms(t)]
                        for t in tags["histograms"]},
         "tensors": {t: [[e.step, e.tensor_proto.string_val[0].decode()] for e in acc.Tensors(t)]
                     for t in tags["tensors"]},
         "graph": [n.name for n in acc.Graph().node] if tags["graph"] else []}
    out[run] = r
print(json.dumps(out))
"""


def tb_json(script, runs):
    """What `script` prints as JSON, run under TensorBoard's interpreter with the run dirs."""
    r = subprocess.run([tb_python(), "-c", script, *map(str, runs)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def read_runs(*runs):
    return tb_json(READ, runs)


def rendered(markdown):
    """The HTML that TensorBoard's Text dashboard makes of a text summary."""
    r = subprocess.run([tb_python(), "-c", "import sys; from tensorboard import plugin_util; "
                        "print(plugin_util.markdown_to_safe_html(sys.stdin.read()))"],
                       input=markdown, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


GRAPHS = r"""
import glob, json, os, sys
from tensorboard.backend.event_processing import event_file_loader
out = {}
for run in sys.argv[1:]:
    n = 0
    for f in glob.glob(os.path.join(run, "events.out.tfevents.*")):
        n += sum(e.HasField("graph_def") for e in event_file_loader.EventFileLoader(f).Load())
    out[run] = n
print(json.dumps(out))
"""


def graph_events(*runs):
    """How many graph events each TensorBoard run directory holds, over all its event files."""
    return tb_json(GRAPHS, runs)


NODES = r"""
import json, sys
from tensorboard.backend.event_processing import event_accumulator as ea
acc = ea.EventAccumulator(sys.argv[1], size_guidance={ea.GRAPH: 1})
acc.Reload()
print(json.dumps([{"name": n.name, "op": n.op, "inputs": list(n.input),
                   "shapes": [[d.size for d in s.dim]
                              for s in n.attr["_output_shapes"].list.shape]}
                  for n in acc.Graph().node]))
"""


def graph_nodes(run):
    """The train run's GraphDef as TensorBoard reads it: name, op, inputs, _output_shapes."""
    return tb_json(NODES, [run])
