#!/usr/bin/env bash
# Placeholder until the Helm chart work lands: installs helm and kubectl into .tools/bin.
exit 0
