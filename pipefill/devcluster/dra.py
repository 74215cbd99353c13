"""Dynamic Resource Allocation for the simulated GPU nodes: the DeviceClass and the ResourceSlices a DRA driver
would publish (one pool of GPUs per node), so the real scheduler allocates ResourceClaims and binds pods that use
them. The driver name and device class follow NVIDIA's DRA driver (``gpu.nvidia.com``).

What stops short of a real node: no kubelet plugin prepares the device (kwok reports the pod Running regardless), so
nothing checks that the containers actually see the GPU.
"""

from __future__ import annotations

from typing import Any

from pipefill.devcluster.kwok import GPU_PRODUCT, GPUS_PER_NODE

__all__ = ["DEVICE_CLASS", "DRIVER", "device_class_and_slices"]

DRIVER = "gpu.nvidia.com"
DEVICE_CLASS = "gpu.nvidia.com"


def _device(node: int, index: int) -> dict[str, Any]:
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"},
            "productName": {"string": GPU_PRODUCT},
            "uuid": {"string": f"GPU-00000000-0000-4000-8000-{node:06d}{index:06d}"},
            "index": {"int": index},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def device_class_and_slices(nodes: int, *, gpus: int = GPUS_PER_NODE) -> list[dict[str, Any]]:
    """The ``gpu.nvidia.com`` DeviceClass and one ResourceSlice per kwok node, all in ``resource.k8s.io/v1``."""
    objects: list[dict[str, Any]] = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        }
    ]
    for node in range(nodes):
        name = f"kwok-node-{node}"
        objects.append(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{name}-{DRIVER}"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": name,
                    "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                    "devices": [_device(node, i) for i in range(gpus)],
                },
            }
        )
    return objects
