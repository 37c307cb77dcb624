//! `doctor`: per backend and fabric, what this host has and how to fix what it lacks.

use super::exit;
use crate::caps::{Feature, HostCaps, TOOLS};

fn mark(ok: bool, colour: bool) -> &'static str {
    match (ok, colour) {
        (true, true) => "\x1b[32m✔\x1b[0m",
        (false, true) => "\x1b[31m✘\x1b[0m",
        (true, false) => "✔",
        (false, false) => "✘",
    }
}

fn feature(f: Feature) -> &'static str {
    match f {
        Feature::Builtin => "built in",
        Feature::Module => "module",
        Feature::Absent => "absent",
        Feature::Unknown => "unknown (no kernel config readable)",
    }
}

pub fn doctor(colour: bool) -> i32 {
    let c = HostCaps::probe();
    let tool = |p: &str| {
        let t = TOOLS.iter().find(|t| t.program == p);
        let ok = c.has(p);
        let fix = if ok {
            String::new()
        } else {
            format!(
                "  → apt-get install {}",
                t.map(|t| t.package).unwrap_or("?")
            )
        };
        format!(
            "  {} {:<20} {}{fix}",
            mark(ok, colour),
            p,
            t.map(|t| t.purpose).unwrap_or("")
        )
    };
    let kf = |name: &str, f: Feature, fix: &str| {
        let fixs = if f.usable() {
            String::new()
        } else {
            format!("  → {fix}")
        };
        format!(
            "  {} {:<20} {}{fixs}",
            mark(f.usable(), colour),
            name,
            feature(f)
        )
    };
    println!(
        "host: kernel {} · {}",
        c.kernel,
        if c.root {
            "running as root"
        } else {
            "not root (the local backend needs root)"
        }
    );

    println!("\nfabric ethernet (path ① tcp) and its faults");
    println!("{}", tool("iperf3"));
    println!("{}", tool("ping"));
    println!("{}", tool("tc"));
    println!(
        "{}",
        kf(
            "tbf (rate faults)",
            c.tbf,
            "a kernel with CONFIG_NET_SCH_TBF"
        )
    );
    println!(
        "{}",
        kf(
            "netem (loss faults)",
            c.netem,
            "optional: without it loss uses nftables"
        )
    );
    println!(
        "{}",
        kf(
            "nft egress hook",
            c.nft_egress,
            "a kernel ≥ 5.16 with CONFIG_NETFILTER_EGRESS (needed when there is no netem)"
        )
    );
    println!("{}", tool("nft"));
    println!("  loss faults here use: {}", c.loss_mechanism().describe());

    println!("\nfabric softroce (path ② roce)");
    for c in crate::preflight::softroce_on_host(&c) {
        println!("{}", preflight_line(&c, colour));
    }

    println!(
        "\nfabric ibsim (path ③ ib: an emulated subnet, the real opensm and infiniband-diags)"
    );
    println!("{}", tool("ibsim"));
    println!("{}", tool("opensm"));
    println!("{}", tool("smpquery"));
    println!("{}", tool("ibtracert"));

    println!("\nfabric hca (real RDMA adapters of this host, --hca DEVICE[:PORT])");
    for line in hca_lines(&c) {
        println!("  {line}");
    }

    for k in crate::backend::KINDS {
        println!("\nbackend {} ({})", k.name(), k.about());
        for c in k.doctor(&c) {
            println!("{}", preflight_line(&c, colour));
        }
    }
    exit::OK
}

/// The host's real adapters, from `ibv_devinfo -v` (sysfs says whether there are any).
fn hca_lines(c: &HostCaps) -> Vec<String> {
    let real: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !crate::fabric::hca::is_software(n))
                .collect()
        })
        .unwrap_or_default();
    if real.is_empty() {
        return vec![
            "· none on this host: ② and ③ run on softroce (rxe) and the emulated subnet".into(),
        ];
    }
    if !c.has("ibv_devinfo") {
        return vec![format!(
            "· {} (install ibverbs-utils to see their ports, rates and GIDs)",
            real.join(", ")
        )];
    }
    let out = crate::run::process::output_within(
        std::process::Command::new("ibv_devinfo").arg("-v"),
        std::time::Duration::from_secs(10),
    );
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    match crate::tools::ibv_devinfo::parse(&text) {
        Ok(d) => crate::fabric::hca::inventory_lines(&d)
            .into_iter()
            .map(|l| format!("✔ {l}"))
            .collect(),
        Err(e) => vec![format!("✘ ibv_devinfo -v: {e}")],
    }
}

/// One preflight check as a doctor row.
pub fn preflight_line(c: &crate::preflight::Check, colour: bool) -> String {
    use crate::preflight::Mark;
    let symbol = match (c.mark, colour) {
        (Mark::Ok, _) => mark(true, colour).to_string(),
        (Mark::Fail, _) => mark(false, colour).to_string(),
        (Mark::Warn, true) => format!("\x1b[33m{}\x1b[0m", c.mark.symbol()),
        (m, _) => m.symbol().to_string(),
    };
    format!("  {symbol} {:<20} {}", c.name, c.text)
}
