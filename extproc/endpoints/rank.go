package endpoints

import (
	"strconv"
	"strings"
)

// rankSuffix joins a server's name and the rank of one of its endpoints.
const rankSuffix = "-rank-"

// RankName names the endpoint of one data-parallel rank of a server that
// serves a rank per port: <server>-rank-<rank>.
func RankName(server string, rank int) string {
	return server + rankSuffix + strconv.Itoa(rank)
}

// ParseRankName splits a name RankName made; ok is false for any other.
func ParseRankName(name string) (server string, rank int, ok bool) {
	i := strings.LastIndex(name, rankSuffix)
	if i <= 0 {
		return "", 0, false
	}
	digits := name[i+len(rankSuffix):]
	rank, err := strconv.Atoi(digits)
	if err != nil || rank < 0 || strconv.Itoa(rank) != digits {
		return "", 0, false
	}
	return name[:i], rank, true
}
