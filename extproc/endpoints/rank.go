package endpoints

import "strconv"

// rankSuffix joins a server's name and the rank of one of its endpoints.
const rankSuffix = "-rank-"

// RankName names the endpoint of one data-parallel rank of a server that
// serves a rank per port: <server>-rank-<rank>. The name is for people and
// dashboards; what places the endpoint is its Spec.DataParallel.
func RankName(server string, rank int) string {
	return server + rankSuffix + strconv.Itoa(rank)
}
