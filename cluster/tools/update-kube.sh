#!/usr/bin/env bash
# Move cluster/tools/kube to another Kubernetes release: ./update-kube.sh v1.36.3
# k8s.io/kubernetes pins its staging modules (k8s.io/api, k8s.io/apimachinery, …) to ./staging in its own go.mod;
# as a dependency each must be pinned to the published tag of the same release (v0.X.Y). This generates those
# replace lines from the release's go.mod instead of writing thirty by hand.
set -euo pipefail
version=${1:?usage: update-kube.sh v1.X.Y}
staging=v0.${version#v1.}
cd "$(dirname "$0")/kube"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
gomod=$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
{
  echo "module pipefill.io/cluster-tools/kube"
  echo
  echo "go $(go env GOVERSION | sed 's/^go\([0-9]*\.[0-9]*\).*/\1/').0"
  echo
  echo "// k8s.io/kubernetes $version pins its staging modules to ./staging in its own go.mod; as a dependency they resolve to their published tags."
  echo "replace ("
  grep -E '^\s+k8s.io/[a-z0-9-]+ => ./staging/' "$gomod" | awk -v v="$staging" '{print "\t" $1 " => " $1 " " v}'
  echo ")"
} > go.mod
rm -f go.sum
for cmd in kube-apiserver kube-controller-manager kube-scheduler; do
  go get -tool "k8s.io/kubernetes/cmd/$cmd@$version"
done

echo "cluster/tools/kube now builds Kubernetes $version; run make cluster-bins"
