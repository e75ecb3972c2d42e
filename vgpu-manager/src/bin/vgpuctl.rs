//! `vgpuctl`: the admin CLI (see `vgpu_manager::cli`).

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VGPU_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let code = vgpu_manager::cli::run_once(
        std::env::args_os(),
        &mut std::io::stdout(),
        &mut std::io::stderr(),
    );
    std::process::exit(code);
}
