"""Give the all-in-one cloud what its services and slicex need, once Keystone answers: the `service` project,
one user per service (roles admin and service there: Nova sends a service token and Neutron requires the
`service` role on it), the catalogue, two flavors and a small image. Idempotent: finds before it creates.

Run by scripts/openstack-aio.sh with Debian's python3 and openstacksdk: bootstrap.py CLOUDS_YAML PASSWORD"""

from __future__ import annotations

import os
import sys

import openstack

SERVICES = {  # user: (service type, endpoint URL)
    "glance": ("image", "http://127.0.0.1:9292"),
    "placement": ("placement", "http://127.0.0.1:8778"),
    "nova": ("compute", "http://127.0.0.1:8774/v2.1"),
    "neutron": ("network", "http://127.0.0.1:9696"),
}
FLAVORS = {"m1.tiny": (512, 1, 1), "m1.small": (2048, 1, 20)}  # name: (RAM MiB, vCPUs, disk GiB)
IMAGE = "slicex-aio-image"


def find_or(create, find):
    return find() or create()


def main(clouds_yaml: str, password: str) -> None:
    os.environ["OS_CLIENT_CONFIG_FILE"] = clouds_yaml
    conn = openstack.connect(cloud="slicex-aio")
    ident = conn.identity
    domain = ident.find_domain("default")
    project = find_or(lambda: ident.create_project(name="service", domain_id=domain.id),
                      lambda: ident.find_project("service", domain_id=domain.id))
    roles = {r: find_or(lambda r=r: ident.create_role(name=r), lambda r=r: ident.find_role(r))
             for r in ("admin", "service")}
    for user_name, (stype, url) in SERVICES.items():
        user = find_or(lambda u=user_name: ident.create_user(name=u, password=password, domain_id=domain.id),
                       lambda u=user_name: ident.find_user(u, domain_id=domain.id))
        for role in roles.values():
            ident.assign_project_role_to_user(project, user, role)
        service = next((s for s in ident.services() if s.type == stype), None) or \
            ident.create_service(name=user_name, type=stype)
        have = {e.interface for e in ident.endpoints(service_id=service.id)}
        for interface in ("public", "internal", "admin"):
            if interface not in have:
                ident.create_endpoint(service_id=service.id, interface=interface, url=url, region_id="RegionOne")
    print("keystone: service project, users, roles and catalogue ready", flush=True)


def flavors_and_image(clouds_yaml: str) -> None:
    """After Nova and Glance answer: the flavors and a blank 1 MiB image (QEMU starts and finds nothing to boot:
    the cheap server of the lifecycle tests; guest_image.py uploads the one that boots)."""
    os.environ["OS_CLIENT_CONFIG_FILE"] = clouds_yaml
    conn = openstack.connect(cloud="slicex-aio")
    for name, (ram, vcpus, disk) in FLAVORS.items():
        if conn.compute.find_flavor(name) is None:
            conn.compute.create_flavor(name=name, ram=ram, vcpus=vcpus, disk=disk)
    if conn.image.find_image(IMAGE) is None:
        conn.image.create_image(name=IMAGE, data=b"\0" * (1 << 20), disk_format="raw", container_format="bare",
                                visibility="public")
    print("nova, glance: flavors and image ready", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "catalogue":
        main(sys.argv[2], sys.argv[3])
    else:
        flavors_and_image(sys.argv[2])
