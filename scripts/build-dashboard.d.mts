export function buildDashboard(outdir?: string): Promise<string>;
