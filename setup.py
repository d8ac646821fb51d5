"""The one thing pyproject.toml cannot say: device_profiles/, at the top of the
repository, goes into the wheel as the package ``edgecv.device_profiles`` (a package
list found under edgecv/ cannot name a folder outside it). Everything else is in
pyproject.toml."""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["edgecv*"]), "edgecv.device_profiles"],
    package_dir={"edgecv.device_profiles": "device_profiles"},
)
