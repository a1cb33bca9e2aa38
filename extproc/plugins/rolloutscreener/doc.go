// Package rolloutscreener is llm-d's disaggregatedset-rollout-screener: it
// keeps the prefill and decode servers of one request on the same
// DisaggregatedSet revision during a rollout, before any profile runs (a
// scheduling.Screener), so no filter, scorer or picker can pair servers
// of different revisions, and it stamps the serving endpoint's selector
// labels on the response for a later request to send back.
//
// Revision gating (modes sum and max-role): among the request's
// candidates that match scope.labelSelector, Ready servers are counted by
// revision and role; a revision missing a Ready server of any role in
// requireRoles gets no traffic; without a strict selector header one of
// the rest is drawn at random by weight (sum: its servers of all required
// roles; max-role: its servers of the role with the most servers over all
// covered revisions, ties to the first listed) and only its endpoints go
// on; with a strict header the request stays on the covered revisions and
// the strict selector narrows them. Endpoints without a revision label, or
// of an uncovered revision, are screened out; none left is a 503
// (no-endpoints). Mode disabled keeps every candidate and only applies the
// selectors.
//
// Header selectors: a strict one keeps only the endpoints whose label
// labelKey equals the request header headerName (when sent; no match is a
// 503, never another revision); a prefer one only stamps (score it with
// header-label-affinity-scorer). Every selector sets its header on the
// response to the serving endpoint's label value.
//
// Unlike llm-d, which counts the Ready pods of its Pod notifications,
// kvgate counts the pool's routable endpoints that match the scope, per
// request: the same pods when the scope's pods are the pool's. llm-d's
// metrics llm_d_epp_disaggregatedset_strict_header_no_match_total and
// _revision_gating_share are not exported.
//
// Parameters:
//
//	scope: {labelSelector: string}  the servers counted for coverage (required; a Kubernetes label selector)
//	headerSelectors: list           {name, headerName, labelKey, mode: strict|prefer} (default none;
//	                                names and header names unique)
//	revisionGating: object          (required)
//	  mode: string                  sum, max-role or disabled (required)
//	  requireRoles: {values: [..]}  roles a revision needs a Ready server of (required for sum, max-role)
//	  revisionLabelKey: string      default disaggregatedset.x-k8s.io/revision
//	  roleLabelKey: string          default disaggregatedset.x-k8s.io/role
package rolloutscreener
