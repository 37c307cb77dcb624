//! The `hca` fabric: a real RDMA adapter of this host carries one path's verbs traffic
//! (an RDMA NIC with an Ethernet link layer carries ② roce, an InfiniBand HCA ③ ib),
//! chosen with `--hca DEVICE[:PORT]`. Both ends of a step run on this host in its own
//! network namespace, so the adapter loops the traffic back: the host-side figures
//! (verbs, syscalls, CPU) are hardware's, but no cable and no switch are crossed. What the
//! emulated subnet does (SM, LIDs, LFTs) is not driven on real hardware: those steps are
//! skipped by the planner.
//!
//! None of this can be exercised on the machines iblab is developed on (they have no RDMA
//! adapter); the choice of port and GID is unit-tested on real `ibv_devinfo -v` output.

use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::json;

use super::Fabric;
use iblab_backend::EnvError;
use iblab_core::counters;
use iblab_core::evidence::{Provenance, ProvenanceKind, StepRecord, Verdict};
use iblab_core::plan::{Action, PlannedStep, Probe, Traffic};
use iblab_lab::{PathKind, ProbeKind, TrafficTest};

/// What the adapter's path starts on this host: `ibv_devinfo` finds and describes the
/// port, perftest's tools run both ends (the adapter loops the traffic back).
const IBV_DEVINFO: &str = "ibv_devinfo";

/// What the path a real adapter carries starts on this host, for this plan.
pub fn programs(plan: &iblab_core::plan::Plan, needs: &mut iblab_core::programs::Needs) {
    use iblab_core::programs::Place;
    let Some(h) = &plan.hca else { return };
    let by = "fabric hca";
    // An adapter the nodes were given: the verbs engine runs there, and a shell reads
    // where the device sits in sysfs; rping is not run on it.
    let place = if h.in_nodes {
        Place::Nodes
    } else {
        Place::Host
    };
    needs.add(place, IBV_DEVINFO, by);
    if h.in_nodes {
        needs.add(place, "sh", by);
        needs.add(place, "cat", by);
        needs.add(place, "grep", by);
        needs.add(place, "rdma", by);
    }
    for s in plan
        .steps
        .iter()
        .filter(|s| s.skip.is_none() && s.path == Some(h.path))
    {
        if let Action::Traffic(t) = &s.action
            && t.test != TrafficTest::Connect
        {
            let tool =
                iblab_tools::perftest::program(t.verb.as_str(), t.test == TrafficTest::Bandwidth);
            needs.add(place, tool, by);
        }
    }
}
use crate::ctx::{StepCtx, excerpt, write_log};
use iblab_core::command::ExecOutput;
use iblab_core::evidence::blank;
use iblab_core::plan::hca::{is_software, path_of};
use iblab_sys::process::{self, Background, Stopped};
use iblab_tools::{ibv_devinfo, perftest};

/// perftest's TCP port for its exchange (another than softroce's, in case both run).
const PORT: u16 = 18520;

/// A real adapter's port, as chosen on the command line.
pub struct Hca {
    pub device: String,
    pub port: u8,
    pub path: PathKind,
    found: Mutex<Option<Found>>,
}

/// What setup found on the port.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub link_layer: String,
    pub gid_index: Option<u32>,
    pub lid: Option<u32>,
    pub rate: Option<String>,
}

impl Hca {
    pub fn new(device: &str, port: u8, path: PathKind) -> Hca {
        Hca {
            device: device.to_string(),
            port,
            path,
            found: Mutex::new(None),
        }
    }

    fn found(&self) -> Option<Found> {
        self.found.lock().ok()?.clone()
    }
}

/// Why a device's port cannot carry a path, as `examine` found it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortUnfit {
    #[error("ibv_devinfo shows no device {device}")]
    NoDevice { device: String },
    #[error("{device} has no port {port}")]
    NoPort { device: String, port: u8 },
    #[error(
        "{device} port {port} has link layer {link_layer}, which carries {}, not {path}",
        carries.map(|x| x.as_str()).unwrap_or("no path of iblab's")
    )]
    LinkLayer {
        device: String,
        port: u8,
        link_layer: String,
        carries: Option<PathKind>,
        path: PathKind,
    },
    #[error(
        "{device} port {port} is {state}, not PORT_ACTIVE{}",
        if *path == PathKind::Ib {
            " (is a subnet manager running on the fabric?)"
        } else {
            " (is its cable in and the link up?)"
        }
    )]
    NotActive {
        device: String,
        port: u8,
        state: String,
        path: PathKind,
    },
    #[error("{device} port {port} has no RoCE v2 GID: give its network interface an address")]
    NoRoceV2Gid { device: String, port: u8 },
}

/// Check a port from `ibv_devinfo -v` for path `path`: ACTIVE, the right link layer, and
/// for RoCE a RoCEv2 GID (an IPv4-mapped one first).
pub fn examine(
    devices: &[ibv_devinfo::Device],
    device: &str,
    port: u8,
    path: PathKind,
) -> Result<Found, PortUnfit> {
    let d = devices
        .iter()
        .find(|d| d.name == device)
        .ok_or_else(|| PortUnfit::NoDevice {
            device: device.into(),
        })?;
    let p = d
        .ports
        .iter()
        .find(|p| p.number == u32::from(port))
        .ok_or_else(|| PortUnfit::NoPort {
            device: device.into(),
            port,
        })?;
    if path_of(&p.link_layer) != Some(path) {
        return Err(PortUnfit::LinkLayer {
            device: device.into(),
            port,
            link_layer: p.link_layer.clone(),
            carries: path_of(&p.link_layer),
            path,
        });
    }
    if !p.active() {
        return Err(PortUnfit::NotActive {
            device: device.into(),
            port,
            state: p.state.clone(),
            path,
        });
    }
    let gid_index = match path {
        PathKind::Roce => {
            let v2 = |g: &&ibv_devinfo::Gid| g.kind == "RoCE v2";
            let g = p
                .gids
                .iter()
                .filter(v2)
                .find(|g| g.gid.starts_with("::ffff:"))
                .or_else(|| p.gids.iter().find(v2))
                .ok_or_else(|| PortUnfit::NoRoceV2Gid {
                    device: device.into(),
                    port,
                })?;
            Some(g.index)
        }
        _ => None,
    };
    let rate = match (&p.active_width, &p.active_speed) {
        (Some(w), Some(s)) => Some(format!("{w} × {s}")),
        _ => None,
    };
    Ok(Found {
        link_layer: p.link_layer.clone(),
        gid_index,
        lid: p.lid.filter(|l| *l > 0),
        rate,
    })
}

/// Doctor's lines for the adapters `ibv_devinfo -v` lists (software devices left out):
/// device and port, state, link layer, rate, LID, RoCE v2 GIDs, and the path `--hca`
/// would carry on it.
pub fn inventory_lines(devices: &[ibv_devinfo::Device]) -> Vec<String> {
    let mut out = Vec::new();
    for d in devices.iter().filter(|d| !is_software(&d.name)) {
        for p in &d.ports {
            let rate = match (&p.active_width, &p.active_speed) {
                (Some(w), Some(s)) => format!("{w} × {s}"),
                _ => "rate ?".to_string(),
            };
            let gids: Vec<String> = p
                .gids
                .iter()
                .filter(|g| g.kind == "RoCE v2")
                .map(|g| format!("[{}] {}", g.index, g.gid))
                .collect();
            let lid = p
                .lid
                .filter(|l| *l > 0)
                .map(|l| format!(", LID {l}"))
                .unwrap_or_default();
            let carries = match path_of(&p.link_layer) {
                Some(path) => format!("--hca {}:{} carries {path}", d.name, p.number),
                None => "carries no path of iblab's".to_string(),
            };
            out.push(format!(
                "{}:{} {} {}, {rate}{lid}{}; {carries}",
                d.name,
                p.number,
                p.state,
                p.link_layer,
                if gids.is_empty() {
                    String::new()
                } else {
                    format!(", RoCE v2 GIDs {}", gids.join(" "))
                }
            ));
        }
    }
    out
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

fn hardware(source: String) -> Option<Provenance> {
    Some(Provenance {
        kind: ProvenanceKind::Hardware,
        source,
    })
}

/// One side's perftest command line on this port.
pub fn perftest_argv(
    tool: &str,
    device: &str,
    port: u8,
    found: &Found,
    size: u64,
    bandwidth_seconds: Option<f64>,
) -> Vec<String> {
    let mut v = words(&[
        tool,
        "-d",
        device,
        "-i",
        &port.to_string(),
        "-s",
        &size.to_string(),
        "-p",
        &PORT.to_string(),
        "-F",
    ]);
    if let Some(g) = found.gid_index {
        v.extend(words(&["-x", &g.to_string()]));
    }
    match bandwidth_seconds {
        Some(s) => v.extend(words(&[
            "-D",
            &format!("{}", s.ceil().max(1.0)),
            "--report_gbits",
        ])),
        None => v.extend(words(&["-n", "1000"])),
    }
    v
}

impl Hca {
    /// The verbs probe (`iblab verbs-probe`, this very binary) on the adapter of this host.
    async fn verbs_probe(
        &self,
        step: &PlannedStep,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        let mut rec = blank(step, at);
        let me = std::env::current_exe()
            .map(|p| p.to_string_lossy().into_owned())
            .map_err(|e| EnvError::caused(format!("cannot find iblab itself: {e}"), e))?;
        let mut show = words(&[&me, "verbs-probe", "--device", &self.device]);
        show.extend(["--port".into(), self.port.to_string()]);
        if let Some(g) = self.found().and_then(|f| f.gid_index) {
            show.extend(["--gid-index".into(), g.to_string()]);
        }
        let out = process::run(&show, None, step.timeout)
            .await
            .map_err(|e| EnvError::new(format!("cannot run the verbs probe: {e}")))?;
        let (rel, abs) = ctx.log_file(step, "verbs-probe");
        write_log(&abs, &show, &out);
        rec.log = Some(rel);
        rec.devices = vec![iblab_core::evidence::DeviceUse::new(
            self.path,
            "host",
            &self.device,
        )];
        rec.provenance = hardware(format!(
            "iblab verbs-probe on {} port {} (a real adapter of this host)",
            self.device, self.port
        ));
        crate::ctx::verbs_report(&mut rec, json!(show), &out);
        Ok(rec)
    }
}

#[async_trait]
impl Fabric for Hca {
    fn name(&self) -> &'static str {
        "hca"
    }
    fn path(&self) -> PathKind {
        self.path
    }

    async fn setup(&self, ctx: &mut StepCtx<'_>) -> Result<(), EnvError> {
        let show = words(&[
            IBV_DEVINFO,
            "-v",
            "-d",
            &self.device,
            "-i",
            &self.port.to_string(),
        ]);
        let out = process::run(&show, None, Duration::from_secs(20))
            .await
            .map_err(|e| EnvError::caused(format!("cannot run ibv_devinfo: {e}"), e))?;
        let _ = std::fs::write(
            ctx.run_dir.join("logs/hca-setup.log"),
            format!("$ {}\n{}{}", show.join(" "), out.stdout, out.stderr),
        );
        let devices = ibv_devinfo::parse(&out.stdout).unwrap_or_default();
        let found = examine(&devices, &self.device, self.port, self.path).map_err(|e| {
            EnvError::caused(format!("--hca {}:{}: {e}", self.device, self.port), e)
        })?;
        if let Ok(mut f) = self.found.lock() {
            *f = Some(found);
        }
        Ok(())
    }

    async fn control(
        &self,
        step: &PlannedStep,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Option<Result<StepRecord, EnvError>> {
        let Action::Probe(Probe { what, path, .. }) = &step.action else {
            return None;
        };
        if *path != self.path {
            return None;
        }
        match what {
            ProbeKind::Device => {}
            ProbeKind::Verbs => return Some(self.verbs_probe(step, ctx, at).await),
            _ => return None,
        }
        let mut rec = blank(step, at);
        rec.provenance = hardware(format!(
            "ibv_devinfo -v on {} port {} (a real adapter of this host)",
            self.device, self.port
        ));
        let found = self.found()?;
        let show = words(&[IBV_DEVINFO, "-v", "-d", &self.device]);
        let out = match process::run(&show, None, Duration::from_secs(10)).await {
            Ok(o) => o,
            Err(e) => return Some(Err(EnvError::new(format!("cannot run ibv_devinfo: {e}")))),
        };
        let (rel, abs) = ctx.log_file(step, "ibv_devinfo");
        write_log(&abs, &show, &out);
        rec.log = Some(rel);
        let dev = ibv_devinfo::parse(&out.stdout)
            .ok()
            .and_then(|d| d.into_iter().find(|d| d.name == self.device));
        let transport = dev.as_ref().map(|d| {
            d.transport
                .split(" (")
                .next()
                .unwrap_or(&d.transport)
                .to_string()
        });
        let gid = dev
            .and_then(|d| {
                d.ports
                    .into_iter()
                    .find(|p| p.number == u32::from(self.port))
            })
            .and_then(|p| {
                p.gids
                    .into_iter()
                    .find(|g| Some(g.index) == found.gid_index)
            });
        rec.detail = json!({"facts": {
            "device": self.device,
            "transport": transport,
            "link_layer": found.link_layer,
            "state": "PORT_ACTIVE",
            "lid": found.lid,
            "rate": found.rate,
            "gid": gid.as_ref().map(|g| g.gid.clone()),
            "gid_index": found.gid_index,
            "address": match (found.lid, &gid) {
                (Some(l), _) if self.path == PathKind::Ib => format!("LID {l}"),
                (_, Some(g)) => format!("GID {}", g.gid),
                _ => "none".to_string(),
            },
        }});
        Some(Ok(rec))
    }

    async fn traffic(
        &self,
        step: &PlannedStep,
        t: &Traffic,
        ctx: &mut StepCtx<'_>,
        at: f64,
    ) -> Result<StepRecord, EnvError> {
        let Traffic {
            test,
            verb,
            size,
            seconds,
            ..
        } = t;
        let mut rec = blank(step, at);
        let Some(found) = self.found() else {
            rec.verdict = Verdict::Error;
            rec.reason = Some("the hca fabric was not set up".into());
            return Ok(rec);
        };
        if *test == TrafficTest::Connect {
            rec.verdict = Verdict::Skipped;
            rec.reason = Some(
                "rping needs the adapter's own IP address on both ends; on --hca it is not run"
                    .into(),
            );
            return Ok(rec);
        }
        let bandwidth = *test == TrafficTest::Bandwidth;
        let tool = iblab_tools::perftest::program(verb.as_str(), bandwidth);
        let secs = bandwidth.then_some(*seconds);
        let server_argv = perftest_argv(
            &tool,
            &self.device,
            self.port,
            &found,
            u64::from(*size),
            secs,
        );
        let (json_rel, json_abs) = ctx.log_file(step, &format!("{tool}-json"));
        let mut client_argv = server_argv.clone();
        if bandwidth {
            client_argv.extend([
                "--out_json".to_string(),
                format!("--out_json_file={}", json_abs.display()),
            ]);
        }
        client_argv.push("127.0.0.1".into());
        let (server_rel, server_log) = ctx.log_file(step, &format!("{tool}-server"));
        let server = Background::start(&server_argv, &server_log)
            .map_err(|e| EnvError::caused(format!("cannot start {tool}: {e}"), e))?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let out = process::run(&client_argv, None, step.timeout)
            .await
            .map_err(|e| EnvError::caused(format!("cannot run {tool}: {e}"), e))?;
        let server_end = server.finish(Duration::from_secs(3)).await;
        let (rel, abs) = ctx.log_file(step, &format!("{tool}-client"));
        write_log(&abs, &client_argv, &out);
        rec.log = Some(rel);
        rec.provenance = hardware(format!(
            "perftest {tool} on {} port {} ({}{}): real verbs on a real adapter; both ends on \
             this host, so the adapter loops the traffic back (no cable, no switch crossed)",
            self.device,
            self.port,
            found.link_layer,
            found
                .rate
                .as_deref()
                .map(|r| format!(", {r}"))
                .unwrap_or_default()
        ));
        rec.detail = json!({
            "client": client_argv,
            "server": server_argv,
            "server_log": server_rel,
            "json": json_rel,
            "exit_code": out.exit_code,
            "device": self.device,
            "port": self.port,
            "gid_index": found.gid_index,
            "lid": found.lid,
            "perftest_settings": perftest::settings(&out.stdout),
        });
        if !out.success() {
            rec.verdict = Verdict::Fail;
            rec.reason = Some(format!(
                "{tool} exited with {:?}: {}",
                out.exit_code,
                perftest::error_line(&format!("{}\n{}", out.stdout, out.stderr))
                    .unwrap_or_else(|| excerpt(out.stderr.trim(), 200))
            ));
            return Ok(rec);
        }
        let json_text = std::fs::read_to_string(&json_abs).unwrap_or_default();
        loopback_results(
            &mut rec,
            bandwidth,
            verb.as_str(),
            out,
            server_end,
            &json_text,
        );
        Ok(rec)
    }
}

/// The figures of a perftest run on the adapter, looped back on this host.
///
/// RDMA traffic does not pass the host's interface counters, and both ends run in the
/// host's namespace, where other traffic does: a "data phase" found there would be
/// someone else's. Whole lives only, and no throughput over time (what the interfaces
/// received is not this transfer).
fn loopback_results(
    rec: &mut StepRecord,
    bandwidth: bool,
    verb: &str,
    out: ExecOutput,
    server_end: Stopped,
    json_text: &str,
) {
    let whole = |c: Option<counters::ProcessCounters>| {
        c.map(|c| counters::ProcessCounters {
            data_phase: None,
            received: Vec::new(),
            ..c
        })
    };
    super::perftest_results(
        rec,
        bandwidth,
        &out.stdout,
        json_text,
        whole(out.counters),
        whole(server_end.counters),
        &format!(
            "sender = the client, which posts the {verb} operations; receiver = the server, \
             the passive side; on a real adapter a post rings the doorbell with a memory \
             write, so the data path makes no syscall (the figures cover each tool's \
             whole life)"
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ibv_devinfo -v` of an rxe device, captured in the vm backend's guest: the same
    /// format a RoCE NIC prints (link layer Ethernet, a GID table with RoCE v1/v2 entries).
    const DEVINFO_V: &str = iblab_tools::testdata::IBV_DEVINFO_V_RXE;

    #[test]
    fn a_roce_port_gets_its_ipv4_mapped_v2_gid() {
        let devices = ibv_devinfo::parse(DEVINFO_V).unwrap();
        let name = devices[0].name.clone();
        let found = examine(&devices, &name, 1, PathKind::Roce).unwrap();
        assert_eq!(found.link_layer, "Ethernet");
        let port = &devices[0].ports[0];
        let g = port
            .gids
            .iter()
            .find(|g| Some(g.index) == found.gid_index)
            .unwrap();
        assert_eq!(g.kind, "RoCE v2");
        assert!(g.gid.starts_with("::ffff:"), "{g:?}");
        let argv = perftest_argv("ib_write_bw", &name, 1, &found, 65536, Some(2.0));
        let x = argv.iter().position(|a| a == "-x").unwrap();
        assert_eq!(argv[x + 1], found.gid_index.unwrap().to_string());
        assert!(argv.contains(&"-D".to_string()));
    }

    #[test]
    fn the_wrong_link_layer_or_port_is_refused_with_the_reason() {
        let devices = ibv_devinfo::parse(DEVINFO_V).unwrap();
        let name = devices[0].name.clone();
        let e = examine(&devices, &name, 1, PathKind::Ib).unwrap_err();
        assert!(matches!(e, PortUnfit::LinkLayer { .. }), "{e}");
        assert!(e.to_string().contains("link layer Ethernet"), "{e}");
        assert!(
            examine(&devices, &name, 2, PathKind::Roce)
                .unwrap_err()
                .to_string()
                .contains("no port 2")
        );
        assert!(
            examine(&devices, "mlx5_9", 1, PathKind::Roce)
                .unwrap_err()
                .to_string()
                .contains("no device")
        );
    }

    #[test]
    fn an_ib_port_uses_its_lid_not_a_gid_index() {
        let mut devices = ibv_devinfo::parse(DEVINFO_V).unwrap();
        // The same port as an IB HCA would show it: link layer InfiniBand, a LID from the SM.
        let p = &mut devices[0].ports[0];
        p.link_layer = "InfiniBand".into();
        p.lid = Some(7);
        let name = devices[0].name.clone();
        let found = examine(&devices, &name, 1, PathKind::Ib).unwrap();
        assert_eq!((found.gid_index, found.lid), (None, Some(7)));
        let argv = perftest_argv("ib_send_lat", &name, 1, &found, 2, None);
        assert!(!argv.contains(&"-x".to_string()));
        devices[0].ports[0].state = "PORT_INIT".into();
        let e = examine(&devices, &name, 1, PathKind::Ib).unwrap_err();
        assert!(matches!(e, PortUnfit::NotActive { .. }), "{e}");
        assert!(e.to_string().contains("subnet manager"), "{e}");
    }

    #[test]
    fn the_inventory_names_real_adapters_and_what_they_carry() {
        let mut devices = ibv_devinfo::parse(DEVINFO_V).unwrap();
        // rxe is software: not listed.
        assert!(inventory_lines(&devices).is_empty());
        devices[0].name = "mlx5_0".into();
        let lines = inventory_lines(&devices);
        assert_eq!(lines.len(), 1);
        let l = &lines[0];
        assert!(
            l.starts_with("mlx5_0:1 PORT_ACTIVE Ethernet, 1X × 2.5 Gbps"),
            "{l}"
        );
        assert!(l.contains("[1] ::ffff:198.18.0.2"), "{l}");
        assert!(l.ends_with("--hca mlx5_0:1 carries roce"), "{l}");
    }
}
