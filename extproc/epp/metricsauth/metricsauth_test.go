package metricsauth

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvgate/kvgate/extproc/endpoints/k8s/k8stest"
)

var suite k8stest.Suite

func TestMain(m *testing.M) { os.Exit(suite.Main(m)) }

// token makes a service account and returns a token the API server issued
// for it.
func token(t *testing.T, cs kubernetes.Interface, name string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, name, &authnv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// The guard against the real API server: a token bound to the upstream
// charts' metrics-reader rule gets the page; another service account's
// token is forbidden; no token or a forged one is unauthorized.
func TestGuard(t *testing.T) {
	env := suite.Env(t)
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reader, other := token(t, cs, "prometheus"), token(t, cs, "someone-else")
	if _, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader"},
		Rules:      []rbacv1.PolicyRule{{NonResourceURLs: []string{"/metrics"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "prometheus", Namespace: "default"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	g, err := New(env.Config, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("metrics page"))
	})))
	defer srv.Close()

	tests := []struct {
		name, auth, path string
		want             int
	}{
		{"allowed", "Bearer " + reader, "/metrics", http.StatusOK},
		{"allowed, cached", "Bearer " + reader, "/metrics", http.StatusOK},
		{"other path", "Bearer " + reader, "/debug", http.StatusForbidden},
		{"not granted", "Bearer " + other, "/metrics", http.StatusForbidden},
		{"forged", "Bearer not-a-token", "/metrics", http.StatusUnauthorized},
		{"basic auth", "Basic dXNlcjpwYXNz", "/metrics", http.StatusUnauthorized},
		{"none", "", "/metrics", http.StatusUnauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", srv.URL+tc.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("status = %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}
