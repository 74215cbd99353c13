// One binary for kube-apiserver, kube-controller-manager and kube-scheduler: the command is the name it is run by
// (bins.py links the three names to it) or, as `kube NAME [flags]`, its first argument. The shared Kubernetes
// packages are linked once instead of three times: about 10 s less of a cold build on two cores, 150 MB less on disk.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // CronJob time zones, as the upstream commands have it

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // the JSON log format
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

var commands = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
}

func main() {
	name := filepath.Base(os.Args[0])
	if _, ok := commands[name]; !ok && len(os.Args) > 1 {
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	newCommand, ok := commands[name]
	if !ok {
		fmt.Fprintln(os.Stderr, "usage: kube {kube-apiserver|kube-controller-manager|kube-scheduler} [flags], or run by one of those names")
		os.Exit(2)
	}
	os.Exit(cli.Run(newCommand()))
}
