package metricsauth

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Decisions are cached this long, so a scraper every few seconds costs the
// API server two reviews per TTL, not per scrape.
const (
	cacheTTL     = 10 * time.Second
	cacheEntries = 1024
	reviewBudget = 5 * time.Second
)

// Guard wraps handlers with the token and access review.
type Guard struct {
	cs  kubernetes.Interface
	log *slog.Logger

	mu    sync.Mutex
	cache map[string]decision // token + path -> decision
}

type decision struct {
	status  int // http.StatusOK, 401 or 403
	expires time.Time
}

// New builds a guard that reviews with cfg's credentials (the picker's
// service account: it needs create on tokenreviews and
// subjectaccessreviews).
func New(cfg *rest.Config, log *slog.Logger) (*Guard, error) {
	rc := rest.CopyConfig(cfg)
	rc.UserAgent = "kvgate-epp-metrics-auth"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("metrics auth client: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Guard{cs: cs, log: log, cache: map[string]decision{}}, nil
}

// Wrap answers 401 without a valid bearer token, 403 when its user may not
// get the path, and otherwise calls next.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			http.Error(w, "Unauthorized: a bearer token is required", http.StatusUnauthorized)
			return
		}
		status := g.decide(r.Context(), token, r.URL.Path)
		switch status {
		case http.StatusOK:
			next.ServeHTTP(w, r)
		case http.StatusUnauthorized:
			http.Error(w, "Unauthorized", status)
		case http.StatusForbidden:
			http.Error(w, "Forbidden", status)
		default:
			http.Error(w, "authorization check failed", status)
		}
	})
}

func (g *Guard) decide(ctx context.Context, token, path string) int {
	key := path + "\x00" + token
	now := time.Now()
	g.mu.Lock()
	if d, ok := g.cache[key]; ok && now.Before(d.expires) {
		g.mu.Unlock()
		return d.status
	}
	g.mu.Unlock()

	status, err := g.review(ctx, token, path)
	if err != nil {
		// The API server is unreachable: refuse without caching, so the
		// next scrape asks again.
		g.log.Warn("metrics auth: review failed", "err", err)
		return http.StatusInternalServerError
	}
	g.mu.Lock()
	if len(g.cache) >= cacheEntries {
		for k, d := range g.cache {
			if now.After(d.expires) {
				delete(g.cache, k)
			}
		}
		if len(g.cache) >= cacheEntries {
			clear(g.cache)
		}
	}
	g.cache[key] = decision{status: status, expires: now.Add(cacheTTL)}
	g.mu.Unlock()
	return status
}

func (g *Guard) review(ctx context.Context, token, path string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, reviewBudget)
	defer cancel()
	tr, err := g.cs.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return 0, fmt.Errorf("token review: %w", err)
	}
	if !tr.Status.Authenticated {
		return http.StatusUnauthorized, nil
	}
	u := tr.Status.User
	extra := make(map[string]authzv1.ExtraValue, len(u.Extra))
	for k, v := range u.Extra {
		extra[k] = authzv1.ExtraValue(v)
	}
	sar, err := g.cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: path, Verb: "get"},
	}}, metav1.CreateOptions{})
	if err != nil {
		return 0, fmt.Errorf("subject access review: %w", err)
	}
	if !sar.Status.Allowed {
		return http.StatusForbidden, nil
	}
	return http.StatusOK, nil
}
