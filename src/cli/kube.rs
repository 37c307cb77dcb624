//! What only the kube backend's build has (`--features kube`): its settings from the
//! global options, `--place`, `render`, `crd`, classes and the operator. Without the
//! feature, [`super`] answers each of these with the fix instead.

use super::{ClassAction, Selection, exit};
use iblab_lab as lab;

/// The kube backend's settings from the global options (`--context`, `--namespace`,
/// `--place`).
pub(super) fn settings(
    context: Option<String>,
    namespace: Option<String>,
    place: &[String],
) -> Result<(), i32> {
    let placement = iblab_k8s::settings::parse_placement(place.iter().map(String::as_str))
        .map_err(|e| {
            eprintln!("error: {e}");
            exit::BAD_INPUT
        })?;
    iblab_k8s::settings::set(context, namespace, Some(placement));
    Ok(())
}

/// `iblab render`: the objects a kube run of this plan applies, as YAML, touching nothing.
pub fn render(sel: &Selection, out: Option<&std::path::Path>, colour: bool) -> i32 {
    if sel.backend != "kube" {
        eprintln!(
            "error: `render` writes Kubernetes objects: use it with --backend kube (got `{}`)",
            sel.backend
        );
        return exit::BAD_INPUT;
    }
    let mut caps = iblab_sys::host::probe();
    let plan = match super::planning::make_plan(sel, &mut caps, colour, None) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let settings = iblab_k8s::settings::get();
    let yaml = match iblab_k8s::manifest::render(iblab_k8s::manifest::RENDER_RUN, &plan, &settings)
    {
        Ok(y) => y,
        Err(e) => {
            eprintln!("error: cannot render the objects: {e}");
            return exit::ENVIRONMENT;
        }
    };
    match out {
        None => print!("{yaml}"),
        Some(dir) => {
            let file = dir.join(format!("{}.yaml", plan.lab));
            if let Err(e) = std::fs::create_dir_all(dir).and_then(|_| std::fs::write(&file, &yaml))
            {
                eprintln!("error: cannot write {}: {e}", file.display());
                return exit::ENVIRONMENT;
            }
            eprintln!("wrote {}", file.display());
        }
    }
    exit::OK
}

/// `iblab crd`: the CustomResourceDefinitions, or labs as Lab objects (what a platform
/// team applies to offer them by name): every built-in one with `all_builtin`, else the
/// ones named (built-in names or lab files, each validated first).
pub fn crd(all_builtin: bool, labs: &[String], colour: bool) -> i32 {
    let names: Vec<String> = if all_builtin {
        lab::builtin::all()
            .iter()
            .map(|b| b.name.to_string())
            .collect()
    } else {
        labs.to_vec()
    };
    if names.is_empty() {
        return match iblab_k8s::crd::render() {
            Ok(t) => {
                print!("{t}");
                exit::OK
            }
            Err(e) => {
                eprintln!("error: {e}");
                exit::ENVIRONMENT
            }
        };
    }
    let mut out = String::new();
    for name in &names {
        let loaded = match super::load_or_report(name, colour) {
            Ok(l) => l,
            Err(code) => return code,
        };
        let obj = iblab_k8s::crd::LabObject::from_lab(&loaded.lab)
            .map_err(|e| e.to_string())
            .and_then(|o| serde_saphyr::to_string(&o).map_err(|e| format!("lab {name}: {e}")));
        match obj {
            Ok(y) => {
                out.push_str("---\n");
                out.push_str(&y);
            }
            Err(e) => {
                eprintln!("error: {e}");
                return exit::ENVIRONMENT;
            }
        }
    }
    print!("{out}");
    exit::OK
}

/// `iblab class …`.
pub(super) fn class(action: ClassAction) -> i32 {
    use iblab_operator::class::apply;
    match action {
        ClassAction::Apply { file } => apply::apply(&file),
        ClassAction::Status {
            file,
            json,
            junit,
            wait,
        } => apply::status(
            &file,
            if json {
                apply::Format::Json
            } else {
                apply::Format::Table
            },
            junit.as_deref(),
            wait,
        ),
        ClassAction::Delete { file } => apply::delete(&file),
        ClassAction::Render { file } => apply::render(&file),
    }
}

/// `iblab operator` (`check`: only whether the CRDs are established and LabRuns listable).
pub(super) fn operator(check: bool, options: iblab_operator::operator::Options) -> i32 {
    match check {
        true => iblab_operator::operator::check(),
        false => iblab_operator::operator::main(options),
    }
}
