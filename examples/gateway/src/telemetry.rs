//! The gateway's telemetry: logs (text or one JSON line per event),
//! Prometheus metrics for `GET /metrics`, and, when `[telemetry]
//! otlp_endpoint` is set, spans and metrics exported over OTLP/HTTP
//! (protobuf) to `{otlp_endpoint}/v1/traces` and `/v1/metrics`.
//!
//! The library emits spans through `tracing` and metrics through the
//! `metrics` facade; everything that exports them lives here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::trace::SdkTracerProvider;
use serde::Deserialize;
use tower_llm_failover::observe::HISTOGRAM_BOUNDARIES;
use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// `[telemetry]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `text` (default) or `json`: one JSON object per line.
    pub log_format: String,
    /// Base URL of an OTLP/HTTP collector (`http://127.0.0.1:4318`): spans
    /// and metrics are exported there when set.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported resource.
    pub service_name: String,
    /// How often metrics are pushed over OTLP.
    pub otlp_metrics_interval_ms: u64,
    /// Print the spans a line was written in (`turn{run_id=...}:`) before
    /// it, in the text format. Off by default: the turn and attempt lines
    /// carry their run id, and keeping every span's fields formatted for
    /// the log costs more than the lines themselves.
    pub log_span_context: bool,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        Self {
            log_format: "text".to_owned(),
            otlp_endpoint: None,
            service_name: "llm-gateway".to_owned(),
            otlp_metrics_interval_ms: 10_000,
            log_span_context: false,
        }
    }
}

/// Installed telemetry: the Prometheus handle `GET /metrics` renders, and
/// the OTLP providers flushed at shutdown.
#[derive(Debug)]
pub struct Telemetry {
    /// Renders the Prometheus exposition (`Gateway::with_prometheus`).
    pub prometheus: PrometheusHandle,
    tracer: Option<SdkTracerProvider>,
    meter: Option<SdkMeterProvider>,
}

/// The log layer as the gateway installs it: `[telemetry]`'s format
/// (the lean line format for text to a file or pipe, `tracing-subscriber`'s
/// with colours on a `terminal` or with span context), writing to
/// `writer`, behind `filter`. Spans reach it only with `log_span_context`.
pub fn log_layer<S, W>(
    config: &TelemetryConfig,
    writer: W,
    filter: EnvFilter,
    terminal: bool,
) -> Result<Box<dyn Layer<S> + Send + Sync>, String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    let fmt = match config.log_format.as_str() {
        // A file or a pipe: the lean line format (no colours, no span
        // context), about a third of the default format's instructions.
        "text" if line_format(config, terminal) => {
            fmt.event_format(crate::log_line::LineFormat).boxed()
        }
        "text" => fmt.with_ansi(terminal).boxed(),
        // One JSON object per line; the event's fields under
        // "fields" (an attempt's `target` field would clash with the
        // line's own `target` if flattened).
        "json" => fmt
            .json()
            .flatten_event(false)
            .with_current_span(false)
            .with_span_list(false)
            .boxed(),
        other => return Err(format!("telemetry.log_format: unknown {other}")),
    };
    // Without span context the log layer is never told of spans: it
    // neither formats nor keeps their fields, and with no OTLP export
    // the spans are not made at all.
    let spans = config.log_span_context;
    // The hint keeps the filter's own (a `filter_fn` has none, and an
    // `and` without a hint makes every callsite's level look enabled).
    let filter = filter.and(
        tracing_subscriber::filter::filter_fn(move |meta| spans || !meta.is_span())
            .with_max_level_hint(tracing_subscriber::filter::LevelFilter::TRACE),
    );
    Ok(fmt.with_filter(filter).boxed())
}

/// Whether the log is written in the lean line format: text to a file or
/// a pipe, without span context.
fn line_format(config: &TelemetryConfig, terminal: bool) -> bool {
    config.log_format == "text" && !terminal && !config.log_span_context
}

impl Telemetry {
    /// Installs the process-wide subscriber and metrics recorder. Logs go
    /// to `writer` (stderr in the gateway).
    pub fn install<W>(config: &TelemetryConfig, writer: W) -> Result<Self, String>
    where
        W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Clone + Send + Sync + 'static,
    {
        let filter = EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| "info,tower_llm_failover=info".into());
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stderr());
        // The lean line format with no OTLP layer to see the events: the
        // turn's line is made from its facts, not dispatched as an event
        // (`TurnLines`; the same bytes).
        let own_turn_lines = line_format(config, terminal) && config.otlp_endpoint.is_none();
        let turn_lines = own_turn_lines.then(|| writer.clone());
        let logs = log_layer(config, writer, filter, terminal)?;
        let resource = Resource::builder()
            .with_service_name(config.service_name.clone())
            .build();
        let (otel, tracer, meter) = match &config.otlp_endpoint {
            None => (None, None, None),
            Some(base) => {
                let base = base.trim_end_matches('/');
                let spans = opentelemetry_otlp::SpanExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(format!("{base}/v1/traces"))
                    .with_headers(HashMap::new())
                    .build()
                    .map_err(|e| format!("telemetry.otlp_endpoint: {e}"))?;
                let tracer = SdkTracerProvider::builder()
                    .with_batch_exporter(spans)
                    .with_resource(resource.clone())
                    .build();
                let layer = tracing_opentelemetry::layer()
                    .with_tracer(tracer.tracer("tower-llm-failover"))
                    // Only the library's spans: not every debug span of the
                    // HTTP stack.
                    .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                        meta.target().starts_with("tower_llm_failover")
                    }));
                let metrics = opentelemetry_otlp::MetricExporter::builder()
                    .with_http()
                    .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                    .with_endpoint(format!("{base}/v1/metrics"))
                    .build()
                    .map_err(|e| format!("telemetry.otlp_endpoint: {e}"))?;
                let reader = opentelemetry_sdk::metrics::PeriodicReader::builder(metrics)
                    .with_interval(Duration::from_millis(config.otlp_metrics_interval_ms))
                    .build();
                let meter = SdkMeterProvider::builder()
                    .with_reader(reader)
                    .with_resource(resource)
                    .build();
                (Some(layer), Some(tracer), Some(meter))
            }
        };
        let logs = tracing_subscriber::registry().with(logs);
        // Not `.with(otel)` with `None`: an absent layer says it wants
        // every callsite, and every span would be made for nobody.
        match otel {
            Some(otel) => logs.with(otel).try_init(),
            None => logs.try_init(),
        }
        .map_err(|e| format!("telemetry: {e}"))?;
        if let Some(writer) = turn_lines {
            // Set once per process, as the subscriber just was.
            let lines = Arc::new(crate::log_line::TurnLines::new(writer));
            tower_llm_failover::observe::set_turn_line_writer(lines)
                .map_err(|_| "telemetry: a turn-line writer is already set".to_owned())?;
        }

        let prometheus = prometheus_builder()
            .map_err(|e| format!("telemetry: {e}"))?
            .build_recorder();
        let handle = prometheus.handle();
        let prometheus = TotalSuffix(prometheus);
        // A fan-out only when there are two recorders: through one, every
        // handle's update goes through a list and a second indirection.
        match &meter {
            Some(meter) => {
                use opentelemetry::metrics::MeterProvider as _;
                let recorders = metrics_util::layers::FanoutBuilder::default()
                    .add_recorder(prometheus)
                    .add_recorder(OtelRecorder::new(meter.meter("tower-llm-failover")));
                metrics::set_global_recorder(recorders.build()).map_err(|e| e.to_string())
            }
            None => metrics::set_global_recorder(prometheus).map_err(|e| e.to_string()),
        }
        .map_err(|e| format!("telemetry: {e}"))?;
        tower_llm_failover::observe::describe_metrics();
        tower_llm_actions::describe_metrics();
        upkeep_every(UPKEEP_EVERY, handle.clone())
            .map_err(|e| format!("telemetry: cannot start the metrics upkeep: {e}"))?;
        Ok(Self {
            prometheus: handle,
            tracer,
            meter,
        })
    }

    /// Pushes everything still buffered to the OTLP collector (blocking):
    /// what the route stacks hold first. Used by the tests; the gateway
    /// flushes at shutdown.
    pub fn flush(&self) -> Result<(), String> {
        tower_llm_failover::observe::flush_metrics();
        if let Some(tracer) = &self.tracer {
            tracer.force_flush().map_err(|e| e.to_string())?;
        }
        if let Some(meter) = &self.meter {
            meter.force_flush().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Flushes and stops the OTLP exporters (blocking).
    pub fn shutdown(self) {
        tower_llm_failover::observe::flush_metrics();
        if let Some(tracer) = self.tracer {
            let _ = tracer.shutdown();
        }
        if let Some(meter) = self.meter {
            let _ = meter.shutdown();
        }
    }
}

/// The Prometheus recorder's builder: every histogram the crates record
/// exposed as a Prometheus histogram with the boundaries the library
/// gives ([`HISTOGRAM_BOUNDARIES`]). Without them the recorder keeps
/// summaries: quantiles that cannot be summed over gateway instances, and
/// a sketch update per sample (about 800 instructions each, four or five
/// samples per request, in the upkeep).
fn prometheus_builder() -> Result<PrometheusBuilder, BuildError> {
    // Only an empty list is refused; the library's are not (its tests say
    // so).
    HISTOGRAM_BOUNDARIES
        .iter()
        .try_fold(PrometheusBuilder::new(), |builder, (name, bounds)| {
            builder.set_buckets_for_metric(Matcher::Full((*name).to_owned()), bounds)
        })
}

/// How often the metrics are kept: what the route stacks hold
/// ([`METRICS_BATCH`](crate::app::METRICS_BATCH)) is handed to the
/// recorders, so a figure reaches `GET /metrics` and the OTLP exporter at
/// most this late, and the Prometheus recorder folds the histogram samples
/// it has taken since the last time into its summaries. Without the
/// second, every sample is kept until a scrape: a gateway nobody scrapes
/// grew by about 80 bytes per request.
pub const UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// Starts the thread that keeps the metrics every `every` for the life
/// of the process (see [`UPKEEP_EVERY`]).
fn upkeep_every(every: Duration, prometheus: PrometheusHandle) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("metrics-upkeep".to_owned())
        .spawn(move || {
            loop {
                std::thread::sleep(every);
                tower_llm_failover::observe::flush_metrics();
                prometheus.run_upkeep();
            }
        })
        .map(drop)
}

/// Prometheus names a counter `*_total` (OpenTelemetry names do not carry
/// it): the suffix is added on the way into the Prometheus recorder only.
struct TotalSuffix<R>(R);

fn with_total(name: &str) -> String {
    format!("{name}.total")
}

impl<R: Recorder> Recorder for TotalSuffix<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0
            .describe_counter(KeyName::from(with_total(key.as_str())), unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        let key = Key::from_parts(
            with_total(key.name()),
            key.labels().cloned().collect::<Vec<_>>(),
        );
        self.0.register_counter(&key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.0.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.0.register_histogram(key, metadata)
    }
}

/// The `metrics` facade into OpenTelemetry instruments, so the same
/// metrics reach Prometheus and OTLP.
struct OtelRecorder {
    meter: Meter,
    counters: Mutex<HashMap<Key, Counter>>,
    gauges: Mutex<HashMap<Key, Gauge>>,
    histograms: Mutex<HashMap<Key, Histogram>>,
    units: Mutex<HashMap<String, Unit>>,
}

impl OtelRecorder {
    fn new(meter: Meter) -> Self {
        Self {
            meter,
            counters: Mutex::default(),
            gauges: Mutex::default(),
            histograms: Mutex::default(),
            units: Mutex::default(),
        }
    }

    fn unit(&self, name: &str) -> Option<&'static str> {
        let units = self.units.lock().unwrap_or_else(PoisonError::into_inner);
        units.get(name).map(|unit| match unit {
            Unit::Seconds => "s",
            Unit::Bytes => "By",
            _ => "1",
        })
    }

    fn describe(&self, key: &KeyName, unit: Option<Unit>) {
        if let Some(unit) = unit {
            self.units
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(key.as_str().to_owned(), unit);
        }
    }
}

fn attributes(key: &Key) -> Vec<KeyValue> {
    key.labels()
        .map(|l| KeyValue::new(l.key().to_owned(), l.value().to_owned()))
        .collect()
}

/// A counter: `absolute` adds the difference from the last value.
struct OtelCounter {
    counter: opentelemetry::metrics::Counter<u64>,
    attributes: Vec<KeyValue>,
    total: AtomicU64,
}

impl metrics::CounterFn for OtelCounter {
    fn increment(&self, value: u64) {
        self.total.fetch_add(value, Ordering::Relaxed);
        self.counter.add(value, &self.attributes);
    }

    fn absolute(&self, value: u64) {
        let before = self.total.fetch_max(value, Ordering::Relaxed);
        if value > before {
            self.counter.add(value - before, &self.attributes);
        }
    }
}

/// A gauge: increments and decrements act on the last value set.
struct OtelGauge {
    gauge: opentelemetry::metrics::Gauge<f64>,
    attributes: Vec<KeyValue>,
    value: Mutex<f64>,
}

impl OtelGauge {
    fn update(&self, f: impl FnOnce(f64) -> f64) {
        let mut value = self.value.lock().unwrap_or_else(PoisonError::into_inner);
        *value = f(*value);
        self.gauge.record(*value, &self.attributes);
    }
}

impl metrics::GaugeFn for OtelGauge {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }

    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }

    fn set(&self, value: f64) {
        self.update(|_| value);
    }
}

struct OtelHistogram {
    histogram: opentelemetry::metrics::Histogram<f64>,
    attributes: Vec<KeyValue>,
}

impl metrics::HistogramFn for OtelHistogram {
    fn record(&self, value: f64) {
        self.histogram.record(value, &self.attributes);
    }
}

impl Recorder for OtelRecorder {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(&key, unit);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(&key, unit);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, _: SharedString) {
        self.describe(&key, unit);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let mut counters = self.counters.lock().unwrap_or_else(PoisonError::into_inner);
        counters
            .entry(key.clone())
            .or_insert_with(|| {
                let mut builder = self.meter.u64_counter(key.name().to_owned());
                if let Some(unit) = self.unit(key.name()) {
                    builder = builder.with_unit(unit);
                }
                Counter::from_arc(Arc::new(OtelCounter {
                    counter: builder.build(),
                    attributes: attributes(key),
                    total: AtomicU64::new(0),
                }))
            })
            .clone()
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let mut gauges = self.gauges.lock().unwrap_or_else(PoisonError::into_inner);
        gauges
            .entry(key.clone())
            .or_insert_with(|| {
                Gauge::from_arc(Arc::new(OtelGauge {
                    gauge: self.meter.f64_gauge(key.name().to_owned()).build(),
                    attributes: attributes(key),
                    value: Mutex::new(0.0),
                }))
            })
            .clone()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let mut histograms = self
            .histograms
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        histograms
            .entry(key.clone())
            .or_insert_with(|| {
                let mut builder = self.meter.f64_histogram(key.name().to_owned());
                if let Some(unit) = self.unit(key.name()) {
                    builder = builder.with_unit(unit);
                }
                // The SDK's default boundaries (0 to 10,000) are made for
                // milliseconds; ours are in the metric's own unit.
                if let Some((_, bounds)) = HISTOGRAM_BOUNDARIES
                    .iter()
                    .find(|(name, _)| *name == key.name())
                {
                    builder = builder.with_boundaries(bounds.to_vec());
                }
                Histogram::from_arc(Arc::new(OtelHistogram {
                    histogram: builder.build(),
                    attributes: attributes(key),
                }))
            })
            .clone()
    }
}
