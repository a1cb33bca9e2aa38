// Package all builds the registry of every plugin kvgate ships. Binaries call
// Registry once at start-up; nothing is registered globally.
package all

import (
	"github.com/kvgate/kvgate/extproc/plugins/agentidentity"
	"github.com/kvgate/kvgate/extproc/plugins/alwaysdisagg"
	"github.com/kvgate/kvgate/extproc/plugins/anthropicparser"
	"github.com/kvgate/kvgate/extproc/plugins/approxprefix"
	"github.com/kvgate/kvgate/extproc/plugins/attrreporter"
	"github.com/kvgate/kvgate/extproc/plugins/burstprefix"
	"github.com/kvgate/kvgate/extproc/plugins/classload"
	"github.com/kvgate/kvgate/extproc/plugins/contextlengthaware"
	"github.com/kvgate/kvgate/extproc/plugins/coremetrics"
	"github.com/kvgate/kvgate/extproc/plugins/dataparallel"
	"github.com/kvgate/kvgate/extproc/plugins/dcgm"
	"github.com/kvgate/kvgate/extproc/plugins/disagg"
	"github.com/kvgate/kvgate/extproc/plugins/endpointattribute"
	"github.com/kvgate/kvgate/extproc/plugins/endpointnotification"
	"github.com/kvgate/kvgate/extproc/plugins/filediscovery"
	"github.com/kvgate/kvgate/extproc/plugins/flowpolicy"
	"github.com/kvgate/kvgate/extproc/plugins/gpuhealth"
	"github.com/kvgate/kvgate/extproc/plugins/headerfilter"
	"github.com/kvgate/kvgate/extproc/plugins/headerlabelaffinity"
	"github.com/kvgate/kvgate/extproc/plugins/headerprofile"
	"github.com/kvgate/kvgate/extproc/plugins/inflightload"
	"github.com/kvgate/kvgate/extproc/plugins/joinhold"
	"github.com/kvgate/kvgate/extproc/plugins/kvcacheutil"
	"github.com/kvgate/kvgate/extproc/plugins/labelselector"
	"github.com/kvgate/kvgate/extproc/plugins/latencyscorer"
	"github.com/kvgate/kvgate/extproc/plugins/latencyslo"
	"github.com/kvgate/kvgate/extproc/plugins/loadaware"
	"github.com/kvgate/kvgate/extproc/plugins/loraaffinity"
	"github.com/kvgate/kvgate/extproc/plugins/metricsdatasource"
	"github.com/kvgate/kvgate/extproc/plugins/mmcache"
	"github.com/kvgate/kvgate/extproc/plugins/models"
	"github.com/kvgate/kvgate/extproc/plugins/multiclusteraffinity"
	"github.com/kvgate/kvgate/extproc/plugins/multiclustermetrics"
	"github.com/kvgate/kvgate/extproc/plugins/multiclusterscore"
	"github.com/kvgate/kvgate/extproc/plugins/nohitlru"
	"github.com/kvgate/kvgate/extproc/plugins/openaiparser"
	"github.com/kvgate/kvgate/extproc/plugins/p2psource"
	"github.com/kvgate/kvgate/extproc/plugins/passthroughparser"
	"github.com/kvgate/kvgate/extproc/plugins/picker"
	"github.com/kvgate/kvgate/extproc/plugins/precise"
	"github.com/kvgate/kvgate/extproc/plugins/preciseproducer"
	"github.com/kvgate/kvgate/extproc/plugins/predictedlatency"
	"github.com/kvgate/kvgate/extproc/plugins/predictedlatencyscorer"
	"github.com/kvgate/kvgate/extproc/plugins/prefix"
	"github.com/kvgate/kvgate/extproc/plugins/prefixaffinity"
	"github.com/kvgate/kvgate/extproc/plugins/prefixpddecider"
	"github.com/kvgate/kvgate/extproc/plugins/probadmitter"
	"github.com/kvgate/kvgate/extproc/plugins/profilehandler"
	"github.com/kvgate/kvgate/extproc/plugins/queue"
	"github.com/kvgate/kvgate/extproc/plugins/rolefilter"
	"github.com/kvgate/kvgate/extproc/plugins/rolloutscreener"
	"github.com/kvgate/kvgate/extproc/plugins/runningrequests"
	"github.com/kvgate/kvgate/extproc/plugins/servedverifier"
	"github.com/kvgate/kvgate/extproc/plugins/sessionaffinity"
	"github.com/kvgate/kvgate/extproc/plugins/sloheadroom"
	"github.com/kvgate/kvgate/extproc/plugins/tokenload"
	"github.com/kvgate/kvgate/extproc/plugins/tokenproducer"
	"github.com/kvgate/kvgate/extproc/plugins/topology"
	"github.com/kvgate/kvgate/extproc/plugins/transfercost"
	"github.com/kvgate/kvgate/extproc/plugins/vertexaiparser"
	"github.com/kvgate/kvgate/extproc/plugins/vllmgrpcparser"
	"github.com/kvgate/kvgate/extproc/plugins/vllmhttpparser"
	"github.com/kvgate/kvgate/extproc/scheduling"
)

// Registry returns a new registry holding all built-in plugins and the
// aliases GIE and llm-d configurations use.
func Registry() *scheduling.Registry {
	r := scheduling.NewRegistry()
	for _, p := range []struct {
		typ string
		f   scheduling.Factory
	}{
		{queue.Type, queue.New},
		{kvcacheutil.Type, kvcacheutil.New},
		{runningrequests.Type, runningrequests.New},
		{tokenload.Type, tokenload.New},
		{loadaware.Type, loadaware.New},
		{loraaffinity.Type, loraaffinity.New},
		{prefix.Type, prefix.New},
		{precise.Type, precise.New},
		{picker.MaxScoreType, picker.NewMaxScore},
		{picker.RandomType, picker.NewRandom},
		{picker.WeightedRandomType, picker.NewWeightedRandom},
		{picker.RoundRobinType, picker.NewRoundRobin},
		{profilehandler.SingleType, profilehandler.NewSingle},
		{headerprofile.Type, headerprofile.New},
		{rolefilter.DecodeType, rolefilter.NewDecode},
		{rolefilter.PrefillType, rolefilter.NewPrefill},
		{rolefilter.EncodeType, rolefilter.NewEncode},
		{inflightload.Type, inflightload.New},
		{predictedlatency.Type, predictedlatency.New},
		{predictedlatencyscorer.Type, predictedlatencyscorer.New},
		{latencyscorer.Type, latencyscorer.New},
		{prefixaffinity.Type, prefixaffinity.New},
		{sloheadroom.Type, sloheadroom.New},
		{latencyslo.Type, latencyslo.New},
		// llm-d's vocabulary: data layer, request parsing, producers.
		{metricsdatasource.Type, metricsdatasource.New},
		{coremetrics.Type, coremetrics.New},
		{coremetrics.GIEType, coremetrics.New},
		{openaiparser.Type, openaiparser.New},
		{approxprefix.Type, approxprefix.New},
		{nohitlru.Type, nohitlru.New},
		{preciseproducer.Type, preciseproducer.New},
		{endpointnotification.Type, endpointnotification.New},
		{tokenproducer.Type, tokenproducer.New},
		{sessionaffinity.Type, sessionaffinity.New},
		{labelselector.Type, labelselector.New},
		{contextlengthaware.Type, contextlengthaware.New},
		{labelselector.ByLabelType, labelselector.NewByLabel},
		{labelselector.Alias, labelselector.NewAlias},
		// P/D, E/P/D and P2P disaggregation.
		{disagg.Type, disagg.New},
		{disagg.PDType, disagg.NewPD},
		{disagg.HeadersType, disagg.NewHeaders},
		{disagg.PrefillHeaderType, disagg.NewPrefillHeader},
		{prefixpddecider.Type, prefixpddecider.New},
		{alwaysdisagg.PDType, alwaysdisagg.NewPD},
		{alwaysdisagg.MultimodalType, alwaysdisagg.NewMultimodal},
		{p2psource.Type, p2psource.New},
		{transfercost.Type, transfercost.New},
		{classload.Type, classload.New},
		{flowpolicy.GlobalStrictType, flowpolicy.NewGlobalStrict},
		{flowpolicy.RoundRobinType, flowpolicy.NewRoundRobin},
		{flowpolicy.ProgramAwareType, flowpolicy.NewProgramAware},
		{flowpolicy.FCFSType, flowpolicy.NewFCFS},
		{flowpolicy.EDFType, flowpolicy.NewEDF},
		{flowpolicy.SLODeadlineType, flowpolicy.NewSLODeadline},
		{flowpolicy.StaticLimitType, flowpolicy.NewStaticLimit},
		{flowpolicy.HoldbackType, flowpolicy.NewHoldback},
		{flowpolicy.SoftReflectType, flowpolicy.NewSoftReflect},
		{flowpolicy.PresenceType, flowpolicy.NewPresence},
		{flowpolicy.UtilizationType, flowpolicy.NewUtilization},
		{flowpolicy.ConcurrencyType, flowpolicy.NewConcurrency},
		{flowpolicy.DecodeStepType, flowpolicy.NewDecodeStep},
		{gpuhealth.FilterType, gpuhealth.NewFilter},
		{gpuhealth.ScorerType, gpuhealth.NewScorer},
		// llm-d's and GIE's remaining vocabulary (compat-plugins).
		{headerfilter.Type, headerfilter.New},
		{probadmitter.Type, probadmitter.New},
		{passthroughparser.Type, passthroughparser.New},
		{anthropicparser.Type, anthropicparser.New},
		{vllmhttpparser.Type, vllmhttpparser.New},
		{vertexaiparser.Type, vertexaiparser.New},
		{agentidentity.Type, agentidentity.New},
		{filediscovery.Type, filediscovery.New},
		{attrreporter.Type, attrreporter.New},
		{servedverifier.Type, servedverifier.New},
		// compat2: the remaining upstream plugins.
		{vllmgrpcparser.Type, vllmgrpcparser.New},
		{models.SourceType, models.NewSource},
		{models.ExtractorType, models.NewExtractor},
		{dcgm.SourceType, dcgm.NewSource},
		{dcgm.ExtractorType, dcgm.NewExtractor},
		{endpointattribute.FilterType, endpointattribute.NewFilter},
		{endpointattribute.ScorerType, endpointattribute.NewScorer},
		{burstprefix.Type, burstprefix.New},
		{joinhold.Type, joinhold.New},
		{mmcache.ProducerType, mmcache.NewProducer},
		{mmcache.ScorerType, mmcache.NewScorer},
		{topology.ExtractorType, topology.NewExtractor},
		{topology.FilterType, topology.NewFilter},
		{topology.ScorerType, topology.NewScorer},
		// dpmc: data-parallel, multicluster, rollout screening.
		{dataparallel.Type, dataparallel.New},
		{rolloutscreener.Type, rolloutscreener.New},
		{headerlabelaffinity.Type, headerlabelaffinity.New},
		// multicluster: a picker whose endpoints are peer clusters.
		{multiclustermetrics.SourceType, multiclustermetrics.NewSource},
		{multiclustermetrics.ExtractorType, multiclustermetrics.NewExtractor},
		{multiclusterscore.KVCacheType, multiclusterscore.NewKVCache},
		{multiclusterscore.QueueType, multiclusterscore.NewQueue},
		{multiclusteraffinity.Type, multiclusteraffinity.New},
		{filediscovery.MultiClusterType, filediscovery.NewMultiCluster},
	} {
		mustNot(r.Register(p.typ, p.f))
	}
	for alias, typ := range map[string]string{
		runningrequests.Alias: runningrequests.Type,
		"kv-cache-scorer":     kvcacheutil.Type, // GIE's earlier name
	} {
		mustNot(r.Alias(alias, typ))
	}
	return r
}

// mustNot turns a registration conflict — a programming error in the list
// above, caught by this package's tests — into a crash at start-up rather
// than a silently missing plugin.
func mustNot(err error) {
	if err != nil {
		panic(err)
	}
}
