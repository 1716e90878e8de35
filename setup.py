"""slicex: a GENI AM API v3 aggregate manager and federation broker built on the ORCA actor model."""

from setuptools import setup

PACKAGES = [
    "slicex",
    "cli",
    "lab",
    "slicex.store",
    "am",
    "slice_manager",
    "authority",
    "authority.substrate",
    "broker",
    "protocol",
    "resources",
    "operations",
    "deployment",
    "clearinghouse",
    "rspec",
    "stitching",
    "federation",
    "fpga_aggregate",
    "experiment",
]

setup(
    name="slicex",
    version="0.1.0",
    description=__doc__,
    python_requires=">=3.11",
    packages=PACKAGES,
    package_dir={"fpga_aggregate": "fpga-aggregate"},
    package_data={"rspec": ["schemas/*.xsd", "schemas/*/*.xsd"],
                  "operations": ["templates/*.html", "static/*"]},
    include_package_data=True,
    install_requires=[
        # lxml and xmlsec must carry the same libxml2 (both 2.14.6 in these wheels): pin the pair.
        "lxml==6.1.3",
        "xmlsec==1.3.17",
        "cryptography>=42",
        "rdflib>=7.0",
        "redis>=5.0",
        "PyYAML>=6.0",
        "Flask>=3.0",  # the operator dashboard (operations/dashboard.py, Jinja2 templates in operations/templates/)
        "numpy>=1.26",  # the FPGA aggregate's FIB compiler
        "prometheus-client>=0.20",  # /metrics on the dashboard's port (operations/metrics.py)
        "pydantic>=2",  # slicex.yaml as one typed model (slicex/config.py)
        "msgspec>=0.18",  # the store's JSON codec (slicex/store/codec.py; bench/codec.py: faster than pydantic)
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-xdist>=3.5", "pytest-timeout>=2.3", "hypothesis>=6.100", "ruff>=0.5", "os-ken>=4.2",
                 "openstacksdk>=3.0", "requests-mock>=1.11",
                 "matplotlib>=3.8", "tqdm>=4.60",
                 # drives Debian's chromium (scripts/system-deps.sh) in the dashboard's browser test
                 "playwright>=1.45"],
        # `slicex experiment` plots and progress bar, scripts/omni_loop.py
        "experiment": ["matplotlib>=3.8", "tqdm>=4.60"],
        # the netns substrate's default OpenFlow controller: without it `slicex up --substrate netns` refuses to
        # start, unless slicex.yaml chooses `netns: {controller: ovs-ofctl}` (never a silent fallback)
        "netns": ["os-ken>=4.2"],
        # the OpenStack substrate driver (authority/substrate/openstack.py; docs/substrate-openstack.md)
        "openstack": ["openstacksdk>=3.0"],
        # sampling profiles of a running `slicex up` (py-spy record --pid ...), as issue 24's CPU cuts were measured
        "profile": ["py-spy>=0.3"],
    },
    entry_points={"console_scripts": ["slicex = cli.main:main"]},
)
