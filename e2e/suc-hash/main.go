// Prints upstream's latestHash (system-upgrade-controller v0.20.1,
// pkg/upgrade/plan.DigestStatus) for the Plans nodewarden's table test
// in src/upgrade/hash.rs pins. Run once: see README.md beside this file.
package main

import (
	"fmt"

	"github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	"github.com/rancher/system-upgrade-controller/pkg/upgrade/plan"
	corectlv1 "github.com/rancher/wrangler/v3/pkg/generated/controllers/core/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// secrets answers Get from a map; DigestStatus calls nothing else.
type secrets struct {
	corectlv1.SecretCache
	m map[string]*corev1.Secret
}

func (s secrets) Get(ns, name string) (*corev1.Secret, error) {
	if sec, ok := s.m[name]; ok {
		return sec, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

func show(label string, p *v1.Plan, s secrets) {
	p.Status.LatestVersion = plan.MungeVersion(p.Spec.Version)
	st, err := plan.DigestStatus(p, s)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%s %s\n", label, st.LatestHash)
}

func main() {
	t := true
	none := secrets{m: map[string]*corev1.Secret{}}

	// Seed 003's Plan, as its README gives it.
	show("seed003", &v1.Plan{
		ObjectMeta: metav1.ObjectMeta{Name: "k3os-latest", Namespace: "k3os-system"},
		Spec: v1.PlanSpec{Concurrency: 1, Channel: "https://github.com/rancher/k3os/releases/latest",
			Version: "v0.9.0-dev", Drain: &v1.DrainSpec{Force: true},
			Upgrade: &v1.ContainerSpec{Image: "rancher/k3os", Command: []string{"k3os", "--debug"}}},
	}, none)

	withSecret := secrets{m: map[string]*corev1.Secret{
		"env": {ObjectMeta: metav1.ObjectMeta{Name: "env", Namespace: "system-upgrade"},
			Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{"TOKEN": []byte("s3cret"), "FOO": []byte("bar")}},
	}}
	// A Secret (and one with ignoreUpdates, absent from the cluster) and a
	// digest annotation naming a string, a list, a number, a false bool
	// (omitted by Go), a label and a path that does not exist.
	show("secret_digest", &v1.Plan{
		ObjectMeta: metav1.ObjectMeta{Name: "k3s-server", Namespace: "system-upgrade",
			Labels:      map[string]string{"tier": "gold"},
			Annotations: map[string]string{"upgrade.cattle.io/digest": "spec.upgrade.image,spec.upgrade.envs,spec.concurrency,spec.cordon,metadata.labels.tier,spec.missing"}},
		Spec: v1.PlanSpec{Concurrency: 2, ServiceAccountName: "system-upgrade", Version: "v1.33.1+k3s1",
			Secrets: []v1.SecretSpec{{Name: "env", Path: "/host/env"}, {Name: "skipped", Path: "skip", IgnoreUpdates: true}},
			Upgrade: &v1.ContainerSpec{Image: "rancher/k3s-upgrade",
				Env: []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "B", Value: "2"}}}},
	}, withSecret)

	// Secret hashes alone: a typed, immutable Secret and one without data.
	tls := secrets{m: map[string]*corev1.Secret{
		"tls": {ObjectMeta: metav1.ObjectMeta{Name: "tls", Namespace: "system-upgrade"},
			Type: corev1.SecretTypeTLS, Immutable: &t,
			Data: map[string][]byte{"tls.crt": []byte("CERT"), "tls.key": {0, 1, 254, 255}}},
		"empty": {ObjectMeta: metav1.ObjectMeta{Name: "empty", Namespace: "system-upgrade"}},
	}}
	show("secrets_only", &v1.Plan{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "system-upgrade"},
		Spec: v1.PlanSpec{Version: "v1",
			Secrets: []v1.SecretSpec{{Name: "tls", Path: "/tls"}, {Name: "empty", Path: "e"}},
			Upgrade: &v1.ContainerSpec{Image: "busybox"}},
	}, tls)
}
