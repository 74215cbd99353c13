module pipefill.io/cluster-tools/pause

go 1.26.0
