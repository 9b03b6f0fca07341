import statistics, time
import pytest
from dflash_provision.remote.ops import read_remote_config
from dflash_provision.target import parse_target
from dflash_provision.transport.factory import Connector
from dflash_provision.transport.options import SshOptions
from dflash_provision.weights_check import check_remote
from tests.fixtures.runtime import DRAFTER_DIR, REFERENCE
from tests.fixtures.safetensors_files import put_weights, reference_shapes
import json

pytestmark = [pytest.mark.integration, pytest.mark.root]
DOC = json.loads(REFERENCE)

def _measure(bed, spec, label):
    opts = SshOptions(ssh_config_path=str(bed.host.client.ssh_config), use_agent=False)
    target = parse_target(spec)
    with Connector(opts).open(target) as t:
        read_remote_config(t, target.config_path)  # warm the connection
        for name, fn in (("config read", lambda: read_remote_config(t, target.config_path)),
                         ("weights", lambda: check_remote(t, target.model_dir, DOC))):
            times = []
            for _ in range(15):
                s = time.monotonic(); r = fn(); times.append(time.monotonic() - s)
            print(f"MEASURE {label} {name}: median {statistics.median(times)*1000:.0f} ms, min {min(times)*1000:.0f}, max {max(times)*1000:.0f}  {getattr(r, 'detail', '')}")

def test_measure_host(bed):
    _measure(bed, f"{bed.host.alias}:{DRAFTER_DIR}", "host, no safetensors")
    put_weights(lambda a, d: bed.host.exec(a, d, check=True), f"{DRAFTER_DIR}/model.safetensors", reference_shapes())
    _measure(bed, f"{bed.host.alias}:{DRAFTER_DIR}", "host, 1 shard")

@pytest.mark.lxc
def test_measure_container(container_bed):
    c = container_bed.container
    put_weights(lambda a, d: c.attach(a, d), f"{DRAFTER_DIR}/model.safetensors", reference_shapes())
    _measure(container_bed.bed, container_bed.target, "container, 1 shard")
