"""System tests: run against a real systemd booted in a container (see sandbox.py).

A package so that conftest.py and the tests can import ``sandbox`` relatively,
without a top-level module name that could collide with another test folder's.
"""
