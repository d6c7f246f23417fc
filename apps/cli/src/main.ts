export async function main(_argv: string[]): Promise<number> { console.log('crisp: not built yet'); return 1; }
